"""What showing a worker's output in the calling cell costs per small call.

    python benchmarks/output.py [--calls 2000] [--json FILE]

This script is the driver of a one-worker cluster. In alternating rounds it times a
small ``rpc_sync`` of a function that prints nothing (``echo``) and of one that prints
one line (``chatty``, whose line is sent to the driver before the reply). A call that
prints nothing pays only the thread's mark and an empty-outbox check around the call
(``output.begin`` / ``output.end``), timed alone here too. The driver's sink counts
the lines instead of printing them. Prints a table; ``--json`` writes its rows (``results.py``).
"""

import nbrpc  # isort: skip  (before torch, as in a notebook)

import argparse
import statistics
import threading
import time
import timeit

import torch.distributed.rpc as rpc
from results import row, write_rows
from rpc_functions import chatty, echo

from nbrpc import _bench

ROUNDS = 10


def timed_calls(func, calls: int) -> list[float]:
    samples = []
    for i in range(calls):
        began = time.perf_counter()
        rpc.rpc_sync("worker1", func, args=(i,))
        samples.append(time.perf_counter() - began)
    return samples


def mark_and_check_us() -> float:
    """``output.begin()`` + ``output.end()`` with nothing written, in microseconds."""
    return min(timeit.repeat(_bench.mark_and_check, number=100_000, repeat=5)) / 100_000 * 1e6


def measure(calls_per_side: int) -> list[dict]:
    sides = {"prints nothing (echo)": echo, "prints one line (chatty)": chatty}
    samples = {name: [] for name in sides}
    per_round = max(1, calls_per_side // ROUNDS)
    for _ in range(ROUNDS):
        for name, func in sides.items():
            timed_calls(func, 20)  # settle after the switch
            samples[name] += timed_calls(func, per_round)
    return [{"what": name, "median_us": statistics.median(s) * 1e6,
             "p90_us": statistics.quantiles(s, n=10)[-1] * 1e6, "calls": len(s)}
            for name, s in samples.items()]


def render(rows: list[dict], around_us: float, lines: int) -> str:
    base = rows[0]["median_us"]
    out = [f"{'rpc_sync of a function that':<42} {'median':>9} {'p90':>9} {'vs silent':>10}"]
    for side in rows:
        out.append(f"{side['what']:<42} {side['median_us']:>7.0f}us {side['p90_us']:>7.0f}us "
                   f"{side['median_us'] / base:>9.2f}x")
    out.append(f"a silent call's own cost (mark + empty check): {around_us:.2f} us "
               f"({around_us / base * 100:.2f}% of its median); lines shown: {lines}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per side")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    shown = []
    lock = threading.Lock()

    def count(worker, pieces, final):
        with lock:
            shown.extend(p[2].count("\n") for p in pieces if p[0] == "stream")

    _bench.OUTPUT_SINKS.add(count)
    cluster = nbrpc.start(1, progress=None)
    try:
        rows = measure(args.calls)
    finally:
        cluster.shutdown()
        _bench.OUTPUT_SINKS.discard(count)
    around = mark_and_check_us()
    print(render(rows, around, sum(shown)))
    silent, chatty_ = rows[0]["median_us"], rows[1]["median_us"]
    note = f"medians of {rows[0]['calls']:,} calls a side, in turns; lines shown: {sum(shown)}"
    write_rows([row("output", chatty_, silent, note=note),
                row("output_silent", around, silent, note="begin + end with nothing written, best of 5")], args.json)


if __name__ == "__main__":
    main()
