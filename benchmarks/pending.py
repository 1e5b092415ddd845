"""What the always-on bookkeeping of pending calls costs per small call.

    python benchmarks/pending.py [--calls 2000] [--json FILE]

Every call a member makes is noted in flight until its reply (``PENDING.calling`` /
``answered``, with the call site: the first frame outside nbrpc and torch), and every
call it serves is noted while it runs (``serving`` / ``done``). This script is the driver
of a one-worker cluster: it times a small ``rpc_sync`` (``echo``) and each half of the
bookkeeping alone, from the same depth of frames as in a call (target: ``targets.toml``).
At rest the bookkeeping runs nothing (no thread, no timer).
Prints a table; ``--json`` writes its rows (``results.py``).
"""

import nbrpc  # isort: skip  (before torch, as in a notebook)

import argparse
import statistics
import threading
import time
import timeit

import torch.distributed.rpc as rpc
from results import row, write_rows
from rpc_functions import echo

from nbrpc._bench import PENDING


def small_call_us(calls: int) -> tuple[float, float]:
    samples = []
    for i in range(calls + 50):
        began = time.perf_counter()
        rpc.rpc_sync("worker1", echo, args=(i,))
        samples.append(time.perf_counter() - began)
    samples = samples[50:]  # settled
    return statistics.median(samples) * 1e6, statistics.quantiles(samples, n=10)[-1] * 1e6


def _in_frames(depth: int, func):
    """``func()`` called ``depth`` frames down (a call goes through a few of nbrpc's own)."""
    if depth == 0:
        return func()
    return _in_frames(depth - 1, func)


def caller_us() -> float:
    """``calling`` + ``answered`` of one call, in microseconds."""
    def one():
        key = PENDING.calling("worker1", echo, None, "rpc_sync")
        PENDING.answered(key)

    return min(timeit.repeat(lambda: _in_frames(3, one), number=50_000, repeat=5)) / 50_000 * 1e6


def callee_us() -> float:
    """``serving`` + ``done`` of one call, in microseconds."""
    def one():
        PENDING.serving("1-1", echo)
        PENDING.done("1-1")

    return min(timeit.repeat(one, number=100_000, repeat=5)) / 100_000 * 1e6


def frames_only_us() -> float:
    return min(timeit.repeat(lambda: _in_frames(3, lambda: None), number=50_000, repeat=5)) / 50_000 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="small calls to time")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    cluster = nbrpc.start(1, progress=None)
    try:
        median, p90 = small_call_us(args.calls)
        threads_at_rest = sorted(t.name for t in threading.enumerate() if "pending" in t.name.lower())
    finally:
        cluster.shutdown()
    caller = caller_us() - frames_only_us()
    callee = callee_us()
    share = (caller + callee) / median
    print(f"{'pending-call bookkeeping, per small rpc_sync':<52} {'us':>7} {'of the call':>12}")
    print(f"{'small rpc_sync (echo), median':<52} {median:>7.0f} {'':>12}")
    print(f"{'caller: calling + answered (with the call site)':<52} {caller:>7.2f} {caller / median:>11.2%}")
    print(f"{'callee: serving + done':<52} {callee:>7.2f} {callee / median:>11.2%}")
    print(f"{'both halves':<52} {caller + callee:>7.2f} {share:>11.2%}")
    print(f"threads of its own at rest: {len(threads_at_rest)}")
    write_rows([row("pending", caller + callee, median,
                    note=f"caller {caller:.2f} us, callee {callee:.2f} us; small call p90 {p90:.0f} us; "
                         f"threads of its own at rest: {len(threads_at_rest)}")], args.json)

if __name__ == "__main__":
    main()
