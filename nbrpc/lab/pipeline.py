"""Lab 4's checks: pipeline parallelism over two shards held as RRefs.

``_Stage`` is the checks' own shard: a seeded linear layer that sleeps a little per
micro-batch (so that the order of the calls shows in their times, even on a loaded
machine) and records, in the process it runs in, when each micro-batch arrived, began
and ended, and whether it came as an RRef or as a tensor.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from .._compat import torch_compat
from ._checking import _call, _Checks, _close, _loss_is, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

_NO_CONTEXT = ("run pipeline_forward, the loss, dist_autograd.backward(context_id, [loss]) "
               "and optimizer.step(context_id) inside `with dist_autograd.context() as "
               "context_id:`")

_ORDER = ("keep the micro-batches' outputs in the order of the micro-batches: "
          "torch.cat(torch.futures.wait_all(futures))")
_WAITED = ("send every micro-batch first (shard1.remote().forward(...), then "
           "shard2.rpc_async().forward(...)) and keep the futures; wait for them all after "
           "the loop, not in it (no .wait() or to_here() inside the loop)")


class _Stage(nn.Module):
    """A pipeline stage for the checks: y = linear(x), 0.1 s per micro-batch, one at a time."""

    def __init__(self, n_in, n_out, seed, pause=0.1):
        super().__init__()
        with torch.random.fork_rng():  # the caller's random stream stays as it was
            torch.manual_seed(seed)
            self.linear, self.pause = nn.Linear(n_in, n_out), pause
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def forward(self, x_in):
        arrived = time.time()
        as_rref, in_context = isinstance(x_in, rpc.PyRRef), _in_context()
        x = x_in.to_here() if as_rref else x_in
        with self._lock:
            began = time.time()
            time.sleep(self.pause)
            y = self.linear(x)
            self.calls.append({"arrived": arrived, "began": began, "ended": time.time(),
                               "rref": as_rref, "rows": len(x),
                               "context": in_context})
        return y

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def weights(self):
        return [p.detach().clone() for p in self.parameters()]

    def call_log(self):
        return list(self.calls)


def _in_context() -> bool:
    """Whether this thread runs inside a distributed autograd context (here: a call's)."""
    return torch_compat.context_id_or_none() is not None


def _stages(pause=0.1):
    """The check's two stages on worker1 and worker2, and the same model here."""
    first = rpc.remote("worker1", _Stage, args=(4, 6, 1, pause))
    second = rpc.remote("worker2", _Stage, args=(6, 3, 2, pause))
    here = nn.Sequential(_Stage(4, 6, 1).linear, _Stage(6, 3, 2).linear)
    return first, second, here


def _serial(first: list[dict], second: list[dict]) -> bool:
    """Whether each micro-batch left for shard1 only after the one before it came back."""
    return len(first) > 1 and all(
        nxt["arrived"] >= done["ended"] - 0.01 for nxt, done in zip(first[1:], second))


@CHECKS.exercise("pipeline.pipeline_forward")
def _check_pipeline_forward(pipeline_forward) -> str:
    first, second, here = _stages()
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(5))
    out = _call(pipeline_forward, first, second, x, 4,
                what="pipeline_forward(shard1, shard2, x, 4)",
                none_hint="return the logits: torch.cat of the micro-batches' outputs")
    log1, log2 = first.rpc_sync().call_log(), second.rpc_sync().call_log()
    if len(log1) != 4:
        raise _Wrong(f"shard1 got {len(log1)} micro-batch(es) for micro_batches=4",
                     "cut the batch with x.tensor_split(micro_batches) and send each piece")
    if not all(c["rref"] for c in log2):
        raise _Wrong("shard2 got the hidden features as a tensor sent from master: they went "
                     "through master because to_here() ran here",
                     "pass shard1's RRef itself to shard2.rpc_async().forward(hidden_rref); "
                     "shard2 fetches it straight from worker1")
    if _serial(log1, log2):
        raise _Wrong("the micro-batches went one at a time: each was sent only after the one "
                     "before it had come back, so the shards never worked together", _WAITED)
    if isinstance(out, (list, tuple)):
        raise _Wrong(f"pipeline_forward returned a {type(out).__name__} of {len(out)} items; "
                     "expected one tensor of logits", _ORDER)
    expected = here(x).detach()
    if not _close(out, expected):
        raise _Wrong(f"the logits are {_show(out)}; shard2(shard1(x)) is {_show(expected)}",
                     _ORDER)
    return "4 micro-batches went through worker1 and worker2 at once, RRef to RRef, in order"


def _moved(shard, before) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(shard.rpc_sync().weights(), before))


def _step_with(optimizer, first, second, x) -> None:
    with dist_autograd.context() as context_id:
        hidden = first.remote().forward(rpc.RRef(x))
        loss = second.rpc_sync().forward(hidden).pow(2).mean()
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)


@CHECKS.exercise("pipeline.make_optimizer")
def _check_make_optimizer(make_optimizer) -> str:
    from torch.distributed.optim import DistributedOptimizer

    first, second, _ = _stages(pause=0.0)
    optimizer = _call(make_optimizer, first, second, 0.1, what="make_optimizer(shard1, shard2, 0.1)",
                      none_hint="return the DistributedOptimizer")
    if not isinstance(optimizer, DistributedOptimizer):
        raise _Wrong(f"make_optimizer returned a {type(optimizer).__name__}: a local optimizer "
                     "cannot reach parameters that live on workers",
                     "DistributedOptimizer(torch.optim.SGD, <parameter RRefs of both shards>, lr=lr)")
    before = [s.rpc_sync().weights() for s in (first, second)]
    _call(_step_with, optimizer, first, second, torch.ones(2, 4),
          what="one step of the check with your optimizer", returns=False)
    still = [f"shard{i} on worker{i}" for i, (s, b) in enumerate(zip((first, second), before), 1)
             if not _moved(s, b)]
    if still:
        raise _Wrong(f"the parameters of {' and '.join(still)} never moved in a step",
                     "give the optimizer the parameter RRefs of both shards: "
                     "shard1.rpc_sync().parameter_rrefs() + shard2.rpc_sync().parameter_rrefs()")
    return "one step of your optimizer moved both shards' parameters on their owners"


def _expected_step(here, x, y, lr):
    """The loss and the new weights of one SGD step on the whole batch, here."""
    loss = F.cross_entropy(here(x), y)
    loss.backward()
    return loss.item(), [(p - lr * p.grad).detach() for p in here.parameters()]


@CHECKS.exercise("pipeline.train_step")
def _check_train_step(train_step) -> str:
    from torch.distributed.optim import DistributedOptimizer

    first, second, here = _stages(pause=0.0)
    inputs = torch.Generator().manual_seed(6)
    x, y, lr = torch.randn(8, 4, generator=inputs), torch.randint(0, 3, (8,), generator=inputs), 0.5
    params = first.rpc_sync().parameter_rrefs() + second.rpc_sync().parameter_rrefs()
    optimizer = DistributedOptimizer(torch.optim.SGD, params, lr=lr)
    expected_loss, expected = _expected_step(here, x, y, lr)
    loss = _call(train_step, first, second, optimizer, x, y, 2,
                 what="train_step(shard1, shard2, optimizer, x, y, 2)",
                 none_hint="return the loss: loss.item()")
    now = first.rpc_sync().weights() + second.rpc_sync().weights()
    if not any(c["context"] for c in second.rpc_sync().call_log()):
        raise _Wrong("the forward pass ran outside a dist_autograd context: its RPCs were not "
                     "recorded, so no gradient could reach the shards", _NO_CONTEXT)
    if all(_close(n, p.detach()) for n, p in zip(now, here.parameters())):
        raise _Wrong("the shards' weights did not change",
                     "call optimizer.step(context_id) inside the context, after "
                     "dist_autograd.backward(context_id, [loss])")
    if not all(_close(n, e) for n, e in zip(now, expected)):
        raise _Wrong("the shards' weights changed, but not by one step on the batch's loss",
                     "one context per step: pipeline_forward, F.cross_entropy, "
                     "dist_autograd.backward, optimizer.step, each once")
    if not _loss_is(loss, expected_loss):
        raise _Wrong(f"the update is right, but train_step returned {_show(loss)}; expected the "
                     f"batch's loss, {expected_loss:.4f}", "return loss.item()")
    return f"one step in 2 micro-batches: loss {float(loss):.4f}, both shards updated exactly"
