"""Checks for the teaching labs in ``tutorials/labs``: one ✓ or ✗ line per exercise.

Parts:

- ``check(exercise, *answer)`` runs one exercise's checker against the live cluster and
  prints one line: ✓ with what was verified, ✗ with what is wrong and a hint, or ✗
  "not done yet". It never raises (the stop button's ``KeyboardInterrupt`` aside), so
  a notebook with unsolved exercises runs to its end.
- ``summary()`` prints how many exercises of the lab pass; ``results()`` returns them.
- The checkers, one per exercise, registered with ``@_exercise``. They call the
  student's code with their own inputs and verify values on the workers. What they
  send to workers lives at module level, so workers import it by reference.
- ``solve`` fills a lab notebook with its reference solutions and ``grade`` runs a
  notebook headless and collects its check lines; both also as ``python -m nbrpc.lab``.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from . import cluster as cluster_mod

__all__ = ["Result", "check", "digits", "grade", "results", "solve", "summary"]

# The workers each lab's %rpc_init cell starts; checks run on exactly these.
LAB_WORKERS = {
    "rpc_basics": ("worker1", "worker2"),
    "dist_autograd": ("worker1", "worker2"),
    "param_server": ("ps", "trainer1", "trainer2"),
}
FILL_IN = "fill in the TODO cell above, run it, then run this check again"


@dataclass
class Result:
    """The outcome of one check: ``status`` is "pass", "wrong" or "not done"."""

    exercise: str
    status: str
    message: str
    hint: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        mark = "✓" if self.passed else "✗"
        unfinished = "not done yet: " if self.status == "not done" else ""
        text = f"{mark} {self.exercise}: {unfinished}{self.message}"
        return text + (f"\n    hint: {self.hint}" if self.hint else "")


class _Wrong(Exception):
    """A checker found a mistake: ``message`` says what, ``hint`` how to fix it."""

    status = "wrong"

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


class _NotDone(_Wrong):
    status = "not done"


_CHECKS: dict[str, Callable[..., str]] = {}
_results: dict[str, Result] = {}
_last_lab: list[str] = []


def _exercise(name: str):
    def register(checker):
        _CHECKS[name] = checker
        return checker
    return register


# -- the notebook API ----------------------------------------------------------------


def check(exercise: str, *answer) -> None:
    """Check ``answer`` (the student's functions) for ``exercise`` and print ✓ or ✗."""
    result = _run_check(exercise, answer)
    if exercise in _CHECKS:
        _results[exercise] = result
        _last_lab[:] = [exercise.split(".")[0]]
    print(result.line(), flush=True)


def summary(lab: str | None = None) -> None:
    """Print how many exercises of ``lab`` (default: the one checked last) pass."""
    lab = lab or (_last_lab[0] if _last_lab else None)
    names = [n for n in _CHECKS if n.split(".")[0] == lab]
    if not names:
        print("no exercise has been checked yet: run the check cells above first", flush=True)
        return
    passed = sum(_results[n].passed for n in names if n in _results)
    lines = [f"{lab}: {passed} of {len(names)} exercises pass"]
    for name in names:
        result = _results.get(name)
        state = {None: "not checked yet (run its check cell)", "pass": "pass",
                 "not done": "not done yet", "wrong": "not right yet (see its check above)"}
        lines.append(f"  {'✓' if result and result.passed else '✗'} {name}: "
                     f"{state[result.status if result else None]}")
    print("\n".join(lines), flush=True)


def results() -> dict[str, Result]:
    """The latest result of every exercise checked in this kernel."""
    return dict(_results)


def _run_check(exercise: str, answer: tuple) -> Result:
    checker = _CHECKS.get(exercise)
    if checker is None:
        known = ", ".join(_CHECKS)
        return Result(exercise, "wrong", f"there is no exercise named {exercise!r}",
                      f"keep the check cell as it was handed out; the exercises are: {known}")
    problem = _cluster_problem(exercise.split(".")[0])
    if problem:
        return Result(exercise, "wrong", problem, "run the %rpc_init cell at the top of this lab "
                      "(after %rpc_shutdown, run it again), then the cells from there on")
    if not answer or any(a is None for a in answer):
        return Result(exercise, "not done", "there is nothing to check yet", FILL_IN)
    try:
        return Result(exercise, "pass", checker(*answer))
    except _Wrong as e:
        _release(e)
        return Result(exercise, e.status, e.message, e.hint)
    except Exception as e:  # a bug in a checker must not stop the lab either
        _release(e)
        return Result(exercise, "wrong", f"the check could not finish: {_describe(e)}",
                      "run the cells above this one in order, then this one again")


def _release(error: BaseException) -> None:
    """Drop the locals of the frames ``error`` went through, now.

    An exception and the frames of its traceback form a cycle that only the garbage
    collector frees; a check's RRefs would then outlive it, maybe the cluster too
    (torch logs an error when an RRef is deleted after its owner is gone).
    """
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__context__


def _cluster_problem(lab: str) -> str:
    cluster = cluster_mod.current()
    if cluster is None or cluster.state != "running":
        return "no cluster is running"
    names = {w.name for w in cluster.workers if w.state == "running"}
    missing = [n for n in LAB_WORKERS[lab] if n not in names]
    if missing:
        return (f"this lab needs the workers {', '.join(LAB_WORKERS[lab])}; "
                f"missing: {', '.join(missing)}")
    return ""


# -- calling the student's code --------------------------------------------------------

# Known errors (regular expressions) -> what usually causes them; the first match wins.
_HINTS = [
    (r"can't call localValue\(\) on user",
     "local_value() works only on the RRef's owner: send a function to rref.owner() with "
     "rpc.rpc_sync and call local_value() there"),
    ("Could not find autograd context",
     "the dist_autograd context had already ended: call dist_autograd.backward, "
     "get_gradients and optimizer.step inside the `with dist_autograd.context() as "
     "context_id:` block"),
    ("graphTask_ INTERNAL ASSERT FAILED",
     "loss.backward() does not follow RPCs; use dist_autograd.backward(context_id, [loss])"),
    (r"missing 1 required positional argument: 'context_id'",
     "DistributedOptimizer.step takes the context id: optimizer.step(context_id)"),
    ("does not require grad",
     "the loss must come from the model's output (computed through RPC), not from a copy "
     "detached from it"),
    (r"KeyError\W*(tensor|Parameter)",
     "get_gradients(context_id) on a process holds only the gradients of that process's "
     "tensors: read it on the tensor's owner"),
]


def _call(fn, *args, what: str, returns: bool = True, none_hint: str = FILL_IN, **kwargs):
    """``fn(*args, **kwargs)``; an error becomes ``_NotDone`` or ``_Wrong`` naming ``what``.

    A function that should return something and returns None is not done yet either.
    """
    if not callable(fn):
        raise _NotDone(f"{what.split('(')[0]} is {_show(fn)}, not a function yet", FILL_IN)
    try:
        value = fn(*args, **kwargs)
    except Exception as e:
        unfinished = _unfinished(e)
        if unfinished is not None:
            name = what.split("(")[0]
            if unfinished in ("", name):
                raise _NotDone(f"{name} still raises NotImplementedError", FILL_IN) from None
            raise _NotDone(f"{what} reached {unfinished}, which still raises NotImplementedError",
                           f"fill in {unfinished} (in this TODO cell or an earlier one), "
                           "run its cell and the cells after it, then this check") from None
        hint = next((h for needle, h in _HINTS if re.search(needle, f"{type(e).__name__}: {e}")),
                    "read the error, fix the TODO cell, run it, then this check again")
        raise _Wrong(f"{what} raised {_describe(e)}", hint) from None
    if returns and value is None:
        raise _NotDone(f"{what.split('(')[0]} returned None", none_hint)
    return value


def _unfinished(error: Exception) -> str | None:
    """The name in a skeleton's ``NotImplementedError("name")``, local or from a worker."""
    text = str(error)
    found = re.search(r"NotImplementedError\((['\"])(\w*)\1\)", text)
    if found:
        return found.group(2)
    if isinstance(error, NotImplementedError) and "On WorkerInfo" not in text:
        return text if text.isidentifier() else ""
    return None


def _describe(error: Exception) -> str:
    """One line about ``error``; a worker's error is named with the worker."""
    text = re.sub(r"For UserRRef\(rref_id=.*?\)\), ", "", str(error))  # ids nobody needs
    text = re.sub(r' at "[^"]*":\d+, please report a bug to PyTorch\.', "", text)
    remote = re.search(r"On WorkerInfo\(id=\d+, name=([^)]+)\):\n(.+)", text)
    if remote:
        return f"{remote.group(2).strip()[:200]} on {remote.group(1)}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        return str([round(v, 4) for v in value.detach().flatten().tolist()][:8])
    if isinstance(value, torch.futures.Future):
        return "a Future (call .wait() on it for the value)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _close(got, expected, atol: float = 1e-4) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and torch.allclose(got.detach().float(), expected.float(), atol=atol))


def _loss_is(loss, expected: float) -> bool:
    """Whether a returned loss (a float, or a one-element tensor) is ``expected``."""
    return isinstance(loss, (float, torch.Tensor)) and abs(float(loss) - expected) <= 1e-4


def _me() -> str:
    return rpc.get_worker_info().name


def _attr_on_owner(rref, name: str):
    """Runs on the owner of ``rref``: one attribute of the object itself."""
    return getattr(rref.local_value(), name)


def digits():
    """scikit-learn's digits as tensors: ``x_train, y_train, x_test, y_test``.

    Pixels scaled to [0, 1]; a stratified quarter of the images is the test set (the
    split of tutorial 01). Fresh copies each time, loaded once (checks load them too).
    """
    return tuple(t.clone() for t in _digits())


@functools.lru_cache(maxsize=1)
def _digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.25, random_state=0, stratify=data.target)
    x_train, x_test = (torch.tensor(a, dtype=torch.float32) / 16 for a in (x_train, x_test))
    return x_train, torch.tensor(y_train), x_test, torch.tensor(y_test)


# -- lab 1: rpc_basics -------------------------------------------------------------------


class _Counter:
    """The lab's Counter, for checks that need one of their own."""

    def __init__(self, start):
        self.count = start

    def add(self, n):
        self.count += n
        return self.count

    def value(self):
        return self.count


@_exercise("rpc_basics.square_on")
def _check_square_on(square_on) -> str:
    inputs = torch.Generator().manual_seed(1)
    for worker in ("worker2", "worker1"):
        x = torch.randn(3, generator=inputs)
        got = _call(square_on, worker, x, what=f"square_on({worker!r}, x)")
        if not (isinstance(got, tuple) and len(got) == 2):
            raise _Wrong(f"square_on({worker!r}, x) returned {_show(got)}; expected the pair "
                         "(x ** 2, name) that square_here returns",
                         "return what rpc.rpc_sync(worker, square_here, args=(x,)) returns, "
                         "unchanged")
        value, where = got
        if where != worker:
            hint = ("square_here(x) runs it right here; rpc.rpc_sync(worker, square_here, "
                    "args=(x,)) runs it on `worker`" if where == _me()
                    else "send the call to the `worker` argument, not to a fixed name")
            raise _Wrong(f"square_here ran on {where}, not on {worker}", hint)
        if not _close(value, x ** 2):
            raise _Wrong(f"square_on({worker!r}, x) gave {_show(value)}, expected x ** 2 = "
                         f"{_show(x ** 2)}", "pass x itself: args=(x,)")
    return "square_here ran on worker2, then on worker1, and x ** 2 came back"


@_exercise("rpc_basics.ask_all")
def _check_ask_all(ask_all) -> str:
    workers = ["worker1", "worker2"]
    answers = _call(ask_all, workers, 0.5, what="ask_all(['worker1', 'worker2'], 0.5)")
    if not isinstance(answers, (list, tuple)) or len(answers) != 2:
        raise _Wrong(f"ask_all returned {_show(answers)}; expected a list of 2 answers, one per "
                     "worker", "return [future.wait() for future in futures]")
    for answer in answers:
        if not (isinstance(answer, tuple) and len(answer) == 3):
            raise _Wrong(f"one answer is {_show(answer)}; expected what slow_hello returns, "
                         "(name, began, ended)", "wait for each future: future.wait()")
    names = [a[0] for a in answers]
    if names != workers:
        hint = ("rpc.rpc_async(worker, slow_hello, args=(seconds,)) runs it on the worker"
                if _me() in names else "keep the answers in the order of `workers`")
        raise _Wrong(f"the answers came from {names}, expected {workers}", hint)
    began, ended = [a[1] for a in answers], [a[2] for a in answers]
    if max(began) >= min(ended):
        raise _Wrong(
            f"the calls ran one after the other: the second began {max(began) - min(ended):.2f} s "
            "after the first had ended",
            "rpc_async(...).wait() right after each call waits before the next call starts; "
            "start every call first, keep the futures, then wait for them")
    return (f"both workers answered and their calls overlapped: two 0.5 s calls took "
            f"{max(ended) - min(began):.2f} s together")


@_exercise("rpc_basics.make_counter")
def _check_make_counter(make_counter) -> str:
    for worker, start in (("worker2", 7), ("worker1", 3)):
        rref = _call(make_counter, worker, start, what=f"make_counter({worker!r}, {start})")
        if not isinstance(rref, rpc.PyRRef):
            if hasattr(rref, "count"):
                raise _Wrong(f"make_counter returned a {type(rref).__name__} object here, on "
                             f"{_me()}: a copy, not a reference to an object on {worker}",
                             "rpc.remote(worker, Counter, args=(start,)) builds the Counter on "
                             "the worker and returns an RRef to it")
            raise _Wrong(f"make_counter returned {_show(rref)}; expected an RRef",
                         "return what rpc.remote(worker, Counter, args=(start,)) returns")
        owner = rref.owner().name
        if owner != worker:
            raise _Wrong(f"the RRef from make_counter({worker!r}, {start}) is owned by {owner}",
                         "pass the `worker` argument to rpc.remote")
        value = _call(lambda: rref.rpc_sync().value(), what="asking the Counter for value()",
                      returns=False)
        if value != start:
            raise _Wrong(f"the Counter on {worker} counts {_show(value)}, expected {start}",
                         "pass the start value to the Counter: args=(start,)")
    return "make_counter('worker2', 7) made a Counter owned by worker2 that counts 7 (worker1 too)"


@_exercise("rpc_basics.add_remote")
def _check_add_remote(add_remote) -> str:
    counter = rpc.remote("worker1", _Counter, args=(10,))
    got = [_call(add_remote, counter, 5, what="add_remote(counter, 5)",
                 none_hint="return the new count, which add(n) returns") for _ in range(2)]
    on_owner = counter.rpc_sync().value()
    if on_owner == 10:
        raise _Wrong(f"the Counter on worker1 still counts 10 after two add_remote(counter, 5) "
                     f"calls (they returned {_show(got[0])} and {_show(got[1])})",
                     "counter_rref.to_here() is a copy: adding to it leaves the original alone. "
                     "counter_rref.rpc_sync().add(n) runs add on the owner")
    if on_owner != 20:
        raise _Wrong(f"the Counter on worker1 counts {on_owner} after adding 5 twice to 10",
                     "call add(n) once per add_remote call")
    if got != [15, 20]:
        raise _Wrong(f"the Counter on worker1 counts 20 as it should, but add_remote returned "
                     f"{_show(got[0])} and {_show(got[1])} instead of 15 and 20",
                     "return the value that add(n) returns")
    return "two add_remote(counter, 5) calls took the Counter on worker1 from 10 to 15 to 20"


@_exercise("rpc_basics.double_on_owner")
def _check_double_on_owner(double_on_owner) -> str:
    start = torch.arange(1.0, 5.0)
    for worker in ("worker2", "worker1"):
        rref = rpc.remote(worker, torch.arange, args=(1.0, 5.0))
        for times in (1, 2):
            _call(double_on_owner, rref, what="double_on_owner(rref)", returns=False)
            now = rref.to_here()
            if torch.equal(now, start * 2 ** (times - 1)):
                raise _Wrong(f"the tensor on {worker} did not change: it still holds {_show(now)}",
                             "double it on its owner, in place: in double_there, "
                             "rref.local_value().mul_(2). x * 2 and to_here() make new tensors "
                             "and leave the owner's alone")
            if not torch.equal(now, start * 2 ** times):
                raise _Wrong(f"after {times} call(s) the tensor on {worker} holds {_show(now)}, "
                             f"expected {_show(start * 2 ** times)}",
                             "multiply by 2, once per call")
    return "the tensors on worker2 and worker1 doubled in place, twice, on their owners"


# -- lab 2: dist_autograd ----------------------------------------------------------------

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


@_exercise("dist_autograd.grad_through_rpc")
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


@_exercise("dist_autograd.grad_of_w")
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


@_exercise("dist_autograd.sgd_step")
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


@_exercise("dist_autograd.train_split")
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


# -- lab 3: param_server -----------------------------------------------------------------


def _rrefs_report(parameter_rrefs) -> dict:
    """Runs on ps: call the student's parameter_rrefs on a fresh module, describe the result."""
    module = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    params, got = list(module.parameters()), parameter_rrefs(module)
    if not isinstance(got, (list, tuple)):
        return {"kind": type(got).__name__}
    return {"kind": "list", "n": len(got), "expected": len(params),
            "not_rrefs": [type(r).__name__ for r in got if not isinstance(r, rpc.PyRRef)],
            "same": [isinstance(r, rpc.PyRRef) and r.is_owner() and r.local_value() is p
                     for r, p in zip(got, params)]}


@_exercise("param_server.parameter_rrefs")
def _check_parameter_rrefs(parameter_rrefs) -> str:
    report = _call(rpc.rpc_sync, "ps", _rrefs_report, args=(parameter_rrefs,),
                   what="parameter_rrefs(module) on ps")
    wrap = "wrap each parameter itself: [RRef(p) for p in module.parameters()]"
    if report["kind"] == "NoneType":
        raise _NotDone("parameter_rrefs returned None", wrap)
    if report["kind"] != "list":
        raise _Wrong(f"parameter_rrefs returned a {report['kind']}; expected a list with one RRef "
                     "per parameter", wrap)
    if report["n"] != report["expected"]:
        raise _Wrong(f"parameter_rrefs returned {report['n']} items for a module with "
                     f"{report['expected']} parameters", wrap)
    if report["not_rrefs"]:
        raise _Wrong(f"parameter_rrefs returned {report['not_rrefs'][0]} items, not RRefs: a "
                     "tensor sent over RPC arrives as a copy, and an optimizer stepping a copy "
                     "leaves the server's model alone", wrap)
    if not all(report["same"]):
        raise _Wrong("the RRefs hold copies of the parameters, not the parameters themselves",
                     "RRef(p), not RRef(p.detach()) or RRef(p.clone()): the optimizer must "
                     "update the very tensors the model computes with")
    return "one RRef per parameter, owned by ps, holding the parameter itself"


class _Server:
    """A linear digits classifier on ps: the check's own parameter server."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(64, 10)

    def forward(self, x):
        return self.model(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]


@_exercise("param_server.train_step")
def _check_train_step(train_step) -> str:
    from torch.distributed.optim import DistributedOptimizer

    x_train, y_train, _, _ = digits()
    x, y, lr = x_train[:32], y_train[:32], 0.5
    server = rpc.remote("ps", _Server)
    optimizer = DistributedOptimizer(torch.optim.SGD, server.rpc_sync().parameter_rrefs(), lr=lr)
    local = _Server().model  # the same seed: the server's initial weights
    expected_loss = F.cross_entropy(local(x), y)
    expected_loss.backward()
    expected = [(p - lr * p.grad).detach() for p in local.parameters()]
    loss = _call(train_step, server, optimizer, x, y, what="train_step(server, optimizer, x, y)",
                 none_hint="return the loss: loss.item()")
    now = server.rpc_sync().weights()
    if all(torch.equal(n, p.detach()) for n, p in zip(now, local.parameters())):
        raise _Wrong("the server's weights did not change",
                     "call optimizer.step(context_id) inside the context, after "
                     "dist_autograd.backward(context_id, [loss])")
    if not all(_close(n, e) for n, e in zip(now, expected)):
        raise _Wrong("the server's weights changed, but not by one SGD step on the batch's loss",
                     "loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y); backward and "
                     "step once")
    if not _loss_is(loss, expected_loss.item()):
        raise _Wrong(f"the update is right, but train_step returned {_show(loss)}; expected the "
                     f"batch's loss, {expected_loss.item():.4f}", "return loss.item()")
    return f"one step on 32 digits: loss {float(loss):.4f} and the server's new weights are right"


def _accuracy_on_owner(server_rref, x, y) -> float:
    """Runs on the server's owner: test accuracy of its model."""
    with torch.no_grad():
        return (server_rref.local_value().model(x).argmax(dim=1) == y).float().mean().item()


@_exercise("param_server.run_training")
def _check_run_training(run_training, ps, trainers, epochs: int = 3, bar: float = 0.9) -> str:
    names = [t.owner().name for t in trainers]
    spans = [_call(rpc.rpc_sync, n, _attr_on_owner, args=(t, "spans"),
                   what=f"building {n}'s Trainer") for n, t in zip(names, trainers)]
    _call(run_training, trainers, epochs, what=f"run_training(trainers, {epochs})", returns=False)
    new = [rpc.rpc_sync(n, _attr_on_owner, args=(t, "spans"))[len(s):]
           for n, t, s in zip(names, trainers, spans)]
    for name, ran in zip(names, new):
        if len(ran) != epochs:
            raise _Wrong(f"{name} trained {len(ran)} epoch(s) in run_training(trainers, {epochs})",
                         "call train_epoch on every trainer once per epoch")
    if not any(max(b for b, _ in epoch) < min(e for _, e in epoch) for epoch in zip(*new)):
        raise _Wrong("the trainers took turns: no two epochs ran at the same time",
                     "in each epoch, start train_epoch on every trainer with rpc_async "
                     "(trainer.rpc_async().train_epoch()), then wait for all the futures")
    _, _, x_test, y_test = digits()
    accuracy = rpc.rpc_sync(ps.owner(), _accuracy_on_owner, args=(ps, x_test, y_test))
    if accuracy < bar:
        raise _Wrong(f"test accuracy {accuracy:.1%} is below the {bar:.0%} bar",
                     "check train_step (loss, backward, optimizer.step) and run every epoch")
    return (f"{', '.join(names)} trained at the same time; test accuracy {accuracy:.1%} "
            f"(bar: {bar:.0%})")


# -- teachers: solutions and grading -----------------------------------------------------


def read_solutions(path) -> dict[str, str]:
    """Sections of a solutions file: ``# %% lab.exercise`` lines start each one."""
    parts = re.split(r"(?m)^# %% ([\w.]+)[ \t]*\n", Path(path).read_text())
    return {name: body.strip() + "\n" for name, body in zip(parts[1::2], parts[2::2])}


def solve(notebook, solutions=None):
    """The lab ``notebook`` with its exercise cells replaced by the reference solutions.

    ``solutions`` defaults to ``solutions/<notebook stem>.py`` next to the notebook.
    Exercise cells carry ``"exercise": "lab.name"`` in their metadata.
    """
    import nbformat

    notebook = Path(notebook)
    answers = read_solutions(solutions or notebook.parent / "solutions" / f"{notebook.stem}.py")
    nb = nbformat.read(notebook, as_version=4)
    cells = {c.metadata["exercise"]: c for c in nb.cells if "exercise" in c.metadata}
    unmatched = sorted(set(cells) ^ set(answers))
    if unmatched:
        raise ValueError(f"exercise cells and solutions do not match: {', '.join(unmatched)}")
    for name, cell in cells.items():
        cell.source = answers[name].rstrip("\n")
    return nb


def grade(notebook, timeout: int = 600) -> list[str]:
    """Run ``notebook`` in a fresh kernel; return its check lines, summary and errors."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(notebook)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    lines = []
    for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        checks = re.search(r"\blab\.(check|summary)\(", cell.source)
        for output in cell.outputs:
            if output.output_type == "error":
                lines.append(f"code cell {index + 1} raised {output.ename}: {output.evalue}")
            elif output.output_type == "stream" and checks:
                lines.extend(output.text.rstrip("\n").splitlines())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbrpc.lab", description="Lab notebooks: "
                                     "fill in the reference solutions, or grade a notebook.")
    commands = parser.add_subparsers(dest="command", required=True)
    solving = commands.add_parser("solve", help="write the notebook with its solutions filled in")
    solving.add_argument("notebook")
    solving.add_argument("-o", "--output", required=True)
    solving.add_argument("--solutions", help="default: solutions/NAME.py next to the notebook")
    grading = commands.add_parser("grade", help="run a notebook in a fresh kernel, print its "
                                  "checks and score; exit status 0 if every exercise passes")
    grading.add_argument("notebook")
    grading.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    if args.command == "solve":
        import nbformat

        try:
            solved = solve(args.notebook, args.solutions)
        except (OSError, ValueError) as e:
            parser.error(str(e))
        nbformat.write(solved, args.output)
        print(f"wrote {args.output}")
        return 0
    lines = grade(args.notebook, args.timeout)
    print("\n".join(lines))
    return 0 if _all_pass(lines) else 1


def _all_pass(lines: list[str]) -> bool:
    """Whether graded ``lines`` end in a full score, with no cell raising on the way."""
    tallies = [m for m in map(re.compile(r": (\d+) of (\d+) exercises pass$").search, lines) if m]
    crashed = any(re.match(r"code cell \d+ raised ", line) for line in lines)
    return bool(tallies) and tallies[-1][1] == tallies[-1][2] and not crashed


if __name__ == "__main__":
    sys.exit(main())
