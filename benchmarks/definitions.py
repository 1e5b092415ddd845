"""Small-call latency with a notebook-defined function: bound once vs pickled by value.

    python benchmarks/definitions.py [--calls 2000] [--json FILE]

This script is the driver (its functions live in ``__main__``, like a notebook's). The
same ``rpc_sync`` to worker1 of a tiny function defined here is timed two ways, in
alternating rounds: nbrpc's ``RpcPickler`` (the function's code pickled once, bound on
the worker once, then only its per-call state) and cloudpickle's plain by-value pickling
of the whole function every call (what nbrpc did before). A function importable by
reference (``operator.add``) is the floor. Prints a table; ``--json`` writes its rows (``results.py``).
"""

import nbrpc  # isort: skip  (before torch, as in a notebook)

import argparse
import operator
import statistics
import time

import cloudpickle
import torch.distributed.rpc as rpc
from results import row, write_rows

from nbrpc import _bench

ROUNDS = 10
SCALE = 3


def scaled(x):
    """A notebook-style target: uses a global and a helper, as real cells do."""
    return helper(x) * SCALE


def helper(x):
    return x + 1


class ByValueEveryCall(_bench.RpcPickler):
    """nbrpc's pickler with definitions pickled as cloudpickle does, whole, every call."""

    def reducer_override(self, obj):
        return cloudpickle.Pickler.reducer_override(self, obj)


def timed_calls(func, args, calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rpc.rpc_sync("worker1", func, args=args)
        samples.append(time.perf_counter() - began)
    return samples


def measure(calls_per_side: int) -> list[dict]:
    sides = {
        "notebook function, bound once (nbrpc)": (_bench.RpcPickler, scaled, (1,)),
        "notebook function, by value every call": (ByValueEveryCall, scaled, (1,)),
        "importable function (operator.add)": (_bench.RpcPickler, operator.add, (1, 2)),
    }
    samples = {name: [] for name in sides}
    per_round = max(1, calls_per_side // ROUNDS)
    for _ in range(ROUNDS):
        for name, (pickler, func, args) in sides.items():
            _bench.set_pickler(pickler)
            timed_calls(func, args, 20)  # settle after the switch
            samples[name] += timed_calls(func, args, per_round)
    _bench.set_pickler(_bench.RpcPickler)
    return [{"what": name, "median_us": statistics.median(s) * 1e6,
             "p90_us": statistics.quantiles(s, n=10)[-1] * 1e6, "calls": len(s)}
            for name, s in samples.items()]


def render(rows: list[dict]) -> str:
    base = rows[1]["median_us"]
    lines = [f"{'rpc_sync of':<42} {'median':>9} {'p90':>9} {'vs by value':>12}"]
    for side in rows:
        lines.append(f"{side['what']:<42} {side['median_us']:>7.0f}us {side['p90_us']:>7.0f}us "
                     f"{side['median_us'] / base:>11.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per side")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    cluster = nbrpc.start(1, progress=None)
    try:
        assert rpc.rpc_sync("worker1", scaled, args=(1,)) == 6
        rows = measure(args.calls)
    finally:
        cluster.shutdown()
    print(render(rows))
    floor = rows[2]["median_us"]
    write_rows([row("definitions", rows[0]["median_us"], rows[1]["median_us"],
                    note=f"medians of {rows[0]['calls']:,} calls a side, in turns; an importable "
                         f"function (the floor): {floor:.0f} us")], args.json)


if __name__ == "__main__":
    main()
