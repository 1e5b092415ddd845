"""What the always-on bookkeeping of pending calls costs per small call.

    python benchmarks/pending.py [--calls 2000] [--json FILE]

Every call a member makes is noted in flight until its reply (``PENDING.calling`` /
``answered``, with the call site: the first frame outside nbrpc and torch), and every
call it serves is noted while it runs (``serving`` / ``done``). This script is the driver
of a one-worker cluster: it times a small ``rpc_sync`` (``echo``) and each half of the
bookkeeping alone, from the same depth of frames as in a call; the target is at most
1% of the small call. At rest the bookkeeping runs nothing (no thread, no timer).
Also timed: naming a call (``functions.named``: an RRef proxy's call by its method, two
identity checks on any other, once on each side) and choosing how a function is sent
(``interrupts.sent_as``, which replaced ``can_stop``: the same checks), and, off the call
path, what keeping a ``torch.futures.Future``'s site adds to making one in Python.
Prints a table; ``--json`` writes the rows.
"""

import nbrpc  # isort: skip  (before torch, as in a notebook)

import argparse
import json
import statistics
import threading
import time
import timeit

import torch
import torch.distributed.rpc as rpc
from targets import echo

from nbrpc.calls import interrupts
from nbrpc.recording import functions, futures
from nbrpc.recording.pending import PENDING

TARGET = 0.01  # of a small rpc_sync's median


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


def naming_us() -> float:
    """``functions.named`` on the caller and on the callee of an ordinary call."""
    args = (1,)

    def one():
        functions.named(echo, args)
        functions.named(echo, args, here=True)

    return min(timeit.repeat(one, number=200_000, repeat=5)) / 200_000 * 1e6


def choosing_us() -> tuple[float, float]:
    """``interrupts.sent_as`` now, and the three checks ``can_stop`` made before it."""
    from nbrpc._compat import torch_compat

    def before(func):
        return (torch_compat.find_builtin(func) is None and not isinstance(func, torch.jit.ScriptFunction)
                and not hasattr(func, torch_compat.ASYNC_EXECUTION_MARK))

    now = min(timeit.repeat(lambda: interrupts.sent_as(echo), number=200_000, repeat=5)) / 200_000 * 1e6
    then = min(timeit.repeat(lambda: before(echo), number=200_000, repeat=5)) / 200_000 * 1e6
    return now, then


def future_site_us() -> tuple[float, float]:
    """Making a ``torch.futures.Future`` in Python with its site kept, and without."""
    futures.hook()
    kept = min(timeit.repeat(torch.futures.Future, number=200_000, repeat=5)) / 200_000 * 1e6
    torch.futures.Future.__init__ = futures._torch_future_init
    try:
        bare = min(timeit.repeat(torch.futures.Future, number=200_000, repeat=5)) / 200_000 * 1e6
    finally:
        futures.hook()
    return kept, bare


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
    naming = naming_us()
    sent_as, can_stop = choosing_us()
    kept, bare = future_site_us()
    share = (caller + callee + naming + max(0.0, sent_as - can_stop)) / median
    rows = {"small_rpc_sync_median_us": median, "small_rpc_sync_p90_us": p90, "caller_us": caller,
            "callee_us": callee, "naming_us": naming, "sent_as_us": sent_as, "can_stop_us": can_stop,
            "future_with_site_us": kept, "future_bare_us": bare,
            "share": share, "target": TARGET, "threads_at_rest": threads_at_rest}
    print(f"{'pending-call bookkeeping, per small rpc_sync':<52} {'us':>7} {'of the call':>12}")
    print(f"{'small rpc_sync (echo), median':<52} {median:>7.0f} {'':>12}")
    print(f"{'caller: calling + answered (with the call site)':<52} {caller:>7.2f} {caller / median:>11.2%}")
    print(f"{'callee: serving + done':<52} {callee:>7.2f} {callee / median:>11.2%}")
    print(f"{'naming the call, caller and callee (functions.named)':<52} {naming:>7.2f} {naming / median:>11.2%}")
    print(f"{'how it is sent: sent_as (can_stop before: ' + f'{can_stop:.2f})':<52} {sent_as:>7.2f} "
          f"{(sent_as - can_stop) / median:>11.2%}")
    verdict = "ok" if share <= TARGET else "OVER"
    total = caller + callee + naming + max(0.0, sent_as - can_stop)
    print(f"{'all of it':<52} {total:>7.2f} {share:>11.2%}  target <= {TARGET:.0%}: {verdict}")
    print(f"off the call path: a Future made in Python, {bare:.2f} us, with its site kept {kept:.2f} us")
    print(f"threads of its own at rest: {len(threads_at_rest)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
