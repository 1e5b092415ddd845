"""Where a call's cost goes, part by part: the user's loops with one part of nbrpc's call
path left out at a time, in one cluster, in turns.

    python benchmarks/parts.py [--rounds 20] [--calls 200] [--loops NAMES]   # make bench-parts

The loops are those of the user's comparison (``user_script.py``): a small ``rpc_sync``
of a function defined in ``__main__``, ``rpc.remote`` + ``to_here``, and ``rpc_async``
with 32 in flight; the first two with a small tensor (4 floats) as the argument; an
``rpc_sync`` and a ``remote`` + ``to_here`` of a cell class's instance (two fields); and
a call through an RRef's proxy.
Each runs as nbrpc runs it, then with one part left out (the part's function swapped for
a stand-in that does nothing, for this measurement only), then with torch's own
functions in nbrpc's cluster (the caller's wrappers left out: torch's pickler is still
nbrpc's, so that row shows what the wrappers cost and nothing else; ``remote``'s and
``to_here``'s apart too). For each: the wall time per call, and the CPU time per call of
the driver (its main thread apart) and of the worker, from
``/proc/PID/task/*/schedstat``; a part's cost is what leaving it out saves. A diagnosis,
not a comparison with a target: ``user.py`` is that.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time

if __name__ == "__main__":
    import nbrpc  # before torch, as a notebook's first cell

import torch
import torch.distributed.rpc as rpc
from usage import cpu_ns

from nbrpc import _bench

WORKER = "worker1"
SMALL_TENSOR = torch.ones(4)


def echo(value):
    return value


def small_calls(n: int) -> None:
    for _ in range(n):
        rpc.rpc_sync(WORKER, echo, args=(1,))


def remote_fetches(n: int) -> None:
    for _ in range(n):
        rpc.remote(WORKER, echo, args=(1,)).to_here()


def tensor_calls(n: int) -> None:
    for _ in range(n):
        rpc.rpc_sync(WORKER, echo, args=(SMALL_TENSOR,))


def tensor_remote_fetches(n: int) -> None:
    for _ in range(n):
        rpc.remote(WORKER, echo, args=(SMALL_TENSOR,)).to_here()


class Point:
    """A cell's class with two fields, as the user's comparison sends (``user_script.py``)."""

    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y


# A cell class's instance: ``bytecodes.py`` puts one of its own ``__main__`` class here. In
# a list: a module's global goes as that module's, by name (``wire.module_globals``), as no
# notebook's instance does.
INSTANCES = [Point(1.0, 2.0)]


def instance_calls(n: int) -> None:
    instance = INSTANCES[0]
    for _ in range(n):
        rpc.rpc_sync(WORKER, echo, args=(instance,))


def instance_remote_fetches(n: int) -> None:
    instance = INSTANCES[0]
    for _ in range(n):
        rpc.remote(WORKER, echo, args=(instance,)).to_here()


class Echo:
    """What an RRef on the worker holds, for calls through its proxy (``user_script.py``)."""

    def echo(self, value):
        return value


def proxy_calls(n: int) -> None:
    proxy = rpc.remote(WORKER, Echo).rpc_sync()
    for _ in range(n):
        proxy.echo(1)


def pipelined(n: int, in_flight: int = 32) -> None:
    waiting = collections.deque()
    for _ in range(n):
        if len(waiting) >= in_flight:
            waiting.popleft().wait()
        waiting.append(rpc.rpc_async(WORKER, echo, args=(1,)))
    while waiting:
        waiting.popleft().wait()


# Each loop, and the share of ``--calls`` it makes (a remote and its fetch are two messages each way).
LOOPS = {"rpc_sync": (small_calls, 1), "remote + to_here": (remote_fetches, 2),
         "rpc_async, 32 in flight": (pipelined, 1), "rpc_sync of a small tensor": (tensor_calls, 1),
         "remote + to_here of a small tensor": (tensor_remote_fetches, 2),
         "rpc_sync of a cell class's instance": (instance_calls, 1),
         "remote + to_here of a cell class's instance": (instance_remote_fetches, 2),
         "an RRef proxy's call": (proxy_calls, 1)}


def _measure(loop, calls: int, worker: int) -> tuple[float, float, float, float]:
    """(wall us, driver CPU us, its main thread's, worker CPU us) per call."""
    me = os.getpid()
    began, driver, main, served = time.perf_counter(), cpu_ns(me), cpu_ns(me, me), cpu_ns(worker)
    loop(calls)
    per = lambda ns: ns / calls / 1e3  # noqa: E731
    return ((time.perf_counter() - began) / calls * 1e6, per(cpu_ns(me) - driver),
            per(cpu_ns(me, me) - main), per(cpu_ns(worker) - served))


def _without(part: str, measure):
    with _bench.left_out(part):
        return measure()


def take_turns(rounds: int, calls: int) -> dict[str, dict[str, list[tuple]]]:
    """Each part against nbrpc whole, in paired turns of ``calls`` (the pair's order
    alternating): the machine's drift from one turn to the next hits both alike."""
    cluster = nbrpc.start(1, progress=None)
    try:
        worker = cluster.workers[0].pid
        for run, _ in LOOPS.values():
            run(200)  # connections, threads, the function's first send
        found = {loop: {name: [] for name in _bench.PARTS} for loop in LOOPS}
        for loop, (run, share) in LOOPS.items():
            print(f"parts: {loop}", file=sys.stderr, flush=True)
            for name in _bench.PARTS:
                for turn in range(rounds):
                    whole = functools.partial(_measure, run, calls // share, worker)
                    if turn % 2:
                        pair = (whole(), _without(name, whole))
                    else:
                        pair = tuple(reversed((_without(name, whole), whole())))
                    found[loop][name].append(pair)
        return found
    finally:
        cluster.shutdown()


def table(found: dict) -> str:
    """Per loop: nbrpc whole, then each part's saving (the median of the paired turns'
    differences), in wall time and in CPU time."""
    lines = []
    for loop, parts in found.items():
        every = [pair[0] for pairs in parts.values() for pair in pairs]
        whole = [statistics.median(s[i] for s in every) for i in range(4)]
        lines.append(f"\n{loop}, per call (us)                       wall   driver (main)   worker")
        lines.append(f"  {'nbrpc':<52} {whole[0]:7.1f} {whole[1]:7.1f} ({whole[2]:6.1f}) {whole[3]:7.1f}")
        for name, pairs in parts.items():
            saved = [statistics.median(a[i] - b[i] for a, b in pairs) for i in range(4)]
            lines.append(f"  - {name:<50} {saved[0]:+7.1f} {saved[1]:+7.1f} ({saved[2]:+6.1f}) {saved[3]:+7.1f}"
                         f"   {saved[0] / whole[0]:+.0%} of the wall")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--loops", help="only these loops, by name, comma separated")
    args = parser.parse_args()
    if args.loops:
        for name in set(LOOPS) - set(args.loops.split(",")):
            del LOOPS[name]
    print(table(take_turns(args.rounds, args.calls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
