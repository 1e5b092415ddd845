"""Lab 1's checks: ``rpc_sync``, ``rpc_async``, ``rpc.remote`` and RRef owners."""

from __future__ import annotations

import torch
import torch.distributed.rpc as rpc

from ._checking import _call, _Checks, _close, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()


def _me() -> str:
    return rpc.get_worker_info().name


class _Counter:
    """The lab's Counter, for checks that need one of their own."""

    def __init__(self, start):
        self.count = start

    def add(self, n):
        self.count += n
        return self.count

    def value(self):
        return self.count


@CHECKS.exercise("rpc_basics.square_on")
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


@CHECKS.exercise("rpc_basics.ask_all")
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


@CHECKS.exercise("rpc_basics.make_counter")
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
        value = _call(lambda rref=rref: rref.rpc_sync().value(), what="asking the Counter for value()",
                      returns=False)
        if value != start:
            raise _Wrong(f"the Counter on {worker} counts {_show(value)}, expected {start}",
                         "pass the start value to the Counter: args=(start,)")
    return "make_counter('worker2', 7) made a Counter owned by worker2 that counts 7 (worker1 too)"


@CHECKS.exercise("rpc_basics.add_remote")
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


@CHECKS.exercise("rpc_basics.double_on_owner")
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
