"""Lab 2's checks: distributed autograd through RPCs and ``DistributedOptimizer``.

``cube``, ``sine``, ``_Scale`` and ``_Shift`` are what the checks send to the workers.
"""

from __future__ import annotations

import collections

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from ._checking import _call, _Checks, _close, _loss_is, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

_calls_here: collections.Counter = collections.Counter()


def cube(x):
    """x ** 3, counting its calls in this process (a check asks where it ran)."""
    _calls_here["cube"] += 1
    return x ** 3


def sine(x):
    """sin(x), counting its calls in this process."""
    _calls_here["sine"] += 1
    return torch.sin(x)


def _calls_of(name: str) -> int:
    return _calls_here[name]


class _Scale(nn.Module):
    """y = w * x with w = [1, 2, ..., n]: the lab's Scale, for checks of their own."""

    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.arange(1.0, n + 1))

    def forward(self, x):
        return self.w * x

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def weights(self):
        return [p.detach().clone() for p in self.parameters()]


class _Shift(_Scale):
    """y = x + b with b = 0."""

    def __init__(self):
        nn.Module.__init__(self)
        self.b = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        return x + self.b


@CHECKS.exercise("dist_autograd.grad_through_rpc")
def _check_grad_through_rpc(grad_through_rpc) -> str:
    inputs = torch.Generator().manual_seed(2)
    for worker, fn, derivative in (("worker1", cube, "3 * x ** 2"), ("worker2", sine, "cos(x)")):
        x = torch.randn(4, generator=inputs).requires_grad_()
        name, before = fn.__name__, rpc.rpc_sync(worker, _calls_of, args=(fn.__name__,))
        grad = _call(grad_through_rpc, worker, fn, x,
                     what=f"grad_through_rpc({worker!r}, {name}, x)",
                     none_hint="distributed autograd does not fill x.grad: return "
                     "dist_autograd.get_gradients(context_id)[x]")
        if rpc.rpc_sync(worker, _calls_of, args=(name,)) == before:
            raise _Wrong(f"{name} never ran on {worker}",
                         "compute fn(x) on the worker: rpc.rpc_sync(worker, fn, args=(x,))")
        expected = 3 * x.detach() ** 2 if name == "cube" else torch.cos(x.detach())
        if not _close(grad, expected):
            raise _Wrong(f"the gradient through {worker} is {_show(grad)}; d/dx {name}(x).sum() "
                         f"= {derivative} = {_show(expected)}",
                         "the loss is fn(x).sum(), and the gradient is taken with respect to x")
    return "the gradients through worker1 (cube: 3x²) and worker2 (sin: cos x) are right"


@CHECKS.exercise("dist_autograd.grad_of_w")
def _check_grad_of_w(grad_of_w) -> str:
    inputs = torch.Generator().manual_seed(3)
    for worker in ("worker2", "worker1"):
        model = rpc.remote(worker, _Scale, args=(3,))
        x = torch.randn(3, generator=inputs)
        grad = _call(grad_of_w, model, x, what="grad_of_w(model_rref, x)",
                     none_hint="return what owner_grad returns; w.grad stays None in distributed "
                     "autograd: on the owner, dist_autograd.get_gradients(context_id)[w] holds "
                     "this context's gradient")
        if not _close(grad, x):
            raise _Wrong(f"the gradient of w on {worker} is {_show(grad)}; d/dw (w * x).sum() = x "
                         f"= {_show(x)}", "return the gradient of the model's w, read on its owner")
    return ("the gradient of w, read on its owner (worker2, then worker1), equals "
            "x = d/dw (w * x).sum()")


@CHECKS.exercise("dist_autograd.sgd_step")
def _check_sgd_step(sgd_step) -> str:
    inputs = torch.Generator().manual_seed(4)
    x, target, lr = torch.randn(3, generator=inputs), torch.randn(3, generator=inputs), 0.1
    model = rpc.remote("worker1", _Scale, args=(3,))
    w = torch.arange(1.0, 4.0)
    expected_loss = F.mse_loss(w * x, target).item()
    expected = w - lr * 2 / 3 * (w * x - target) * x
    loss = _call(sgd_step, model, x, target, lr, what="sgd_step(model_rref, x, target, 0.1)",
                 none_hint="return the loss: loss.item()")
    (now,) = model.rpc_sync().weights()
    if torch.equal(now, w):
        raise _Wrong("w on worker1 did not change: it is still [1, 2, 3]",
                     "give DistributedOptimizer the RRefs of the parameters on their owner "
                     "(model_rref.rpc_sync().parameter_rrefs()) and call "
                     "optimizer.step(context_id) inside the context")
    if not _close(now, expected):
        raise _Wrong(f"after one step w on worker1 is {_show(now)}, expected w - lr * dloss/dw = "
                     f"{_show(expected)}", "one step of torch.optim.SGD with lr=lr on "
                     "F.mse_loss(model output, target)")
    if not _loss_is(loss, expected_loss):
        raise _Wrong(f"w moved right, but sgd_step returned {_show(loss)}; expected the loss "
                     f"before the step, {expected_loss:.4f}", "return loss.item()")
    return f"one step moved w on worker1 from [1, 2, 3] to {_show(now)}, exactly w - lr * dloss/dw"


@CHECKS.exercise("dist_autograd.train_split")
def _check_train_split(train_split) -> str:
    scale, shift = rpc.remote("worker1", _Scale, args=(1,)), rpc.remote("worker2", _Shift)
    x = torch.linspace(-1, 1, 32)
    losses = _call(train_split, scale, shift, x, 3 * x + 2, 60, 0.3,
                   what="train_split(scale, shift, x, y, 60, 0.3)",
                   none_hint="return the list of losses, one float per step")
    a, b = (float(r.rpc_sync().weights()[0]) for r in (scale, shift))
    unchanged = [f"{name} on {worker} (still {v:g})" for name, worker, v, start in
                 (("a", "worker1", a, 1.0), ("b", "worker2", b, 0.0)) if v == start]
    if unchanged:
        raise _Wrong(f"{' and '.join(unchanged)} never moved",
                     "one DistributedOptimizer over the parameter RRefs of both stages: "
                     "scale.rpc_sync().parameter_rrefs() + shift.rpc_sync().parameter_rrefs()")
    if abs(a - 3) > 0.05 or abs(b - 2) > 0.05:
        raise _Wrong(f"after 60 steps a = {a:.3f} and b = {b:.3f}; they should be close to 3 and 2",
                     "take one optimizer step per iteration, each in its own dist_autograd "
                     "context, on F.mse_loss(shift(scale(x)), y)")
    if not isinstance(losses, (list, tuple)) or len(losses) != 60:
        raise _Wrong(f"a and b are right, but train_split returned {_show(losses)}",
                     "return a list of the 60 losses, one float per step (loss.item())")
    return (f"60 steps through worker1 and worker2 fit a = {a:.3f}, b = {b:.3f} (3 and 2); "
            f"the loss fell from {float(losses[0]):.2f} to {float(losses[-1]):.1e}")
