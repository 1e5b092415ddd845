"""How the costs of a local cluster grow with its size: the scale table.

    python benchmarks/scale.py [--sizes 1,4,16,32,64] [--json FILE]

Each size runs in a fresh driver process (a plain script, as the other benchmarks):
a first ``nbrpc.start(n)`` warms the template and is shut down, then, timed: a warm
``nbrpc.start(n)``; a fan-out round (one small ``rpc_async`` to every worker, then
waiting for all; the median of 20 rounds); ``rref_snapshot()`` with 8 RRefs a worker
(median of 5); ``cluster.status()`` (median of 5); PSS per process (workers and the
driver, ``/proc/PID/smaps_rollup``); and ``shutdown()``. Target: shutdown of 32 workers
under 1 s, and every row growing at most linearly: from 16 workers to 32 (and 64)
no row may grow more than ``LINEAR_SLACK`` times the ratio of the sizes. The big
sizes take minutes on 2 cores: ``make bench`` runs 1, 4, 16 and 32.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 4, 16, 32)
SHUTDOWN_32_TARGET = 1.0
LINEAR_SLACK = 1.5  # a row may grow 1.5x faster than n between two sizes (noise on a busy machine)
ROWS = ("start", "fanout", "snapshot", "status", "shutdown", "pss")
LABELS = {"start": "warm start (s)", "fanout": "fan-out round, 1 rpc_async a worker (ms)",
          "snapshot": "rref_snapshot, 8 RRefs a worker (ms)", "status": "cluster.status() (ms)",
          "shutdown": "shutdown (s)", "pss": "PSS per process (MiB)"}


def pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(n: int) -> dict:
    """One driver: the measurements of one size, as a dict."""
    sys.path.insert(0, str(ROOT))
    import nbrpc  # noqa: I001 (before torch, as in a notebook)
    import torch
    import torch.distributed.rpc as rpc

    nbrpc.start(n, progress=None, startup_timeout=600).shutdown()  # the template is warm now
    began = time.perf_counter()
    cluster = nbrpc.start(n, progress=None, startup_timeout=600)
    start = time.perf_counter() - began
    try:
        names = [w.name for w in cluster.workers]
        fanout = []
        for _ in range(20):
            began = time.perf_counter()
            torch.futures.wait_all([rpc.rpc_async(name, os.getpid) for name in names])
            fanout.append(time.perf_counter() - began)
        held = [rpc.remote(name, torch.add, args=(torch.ones(2), i)) for name in names for i in range(8)]
        for rref in held:
            rref.to_here()
        snapshot = _median_seconds(nbrpc.rref_snapshot, 5)
        status = _median_seconds(cluster.status, 5)
        time.sleep(0.5)
        pss = [pss_mib(w.pid) for w in cluster.workers] + [pss_mib(os.getpid())]
        del held
    finally:
        began = time.perf_counter()
        cluster.shutdown()
        shutdown = time.perf_counter() - began
    return {"n": n, "start": start, "fanout": statistics.median(fanout) * 1e3, "snapshot": snapshot * 1e3,
            "status": status * 1e3, "shutdown": shutdown, "pss": statistics.mean(pss),
            "load": os.getloadavg()[0]}


def _median_seconds(call, times: int) -> float:
    samples = []
    for _ in range(times):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def run(n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(n)], check=True, capture_output=True,
                         text=True, cwd=ROOT, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def missed(results: list[dict]) -> list[str]:
    """The targets the results miss, each named."""
    found = []
    by_n = {r["n"]: r for r in results}
    if 32 in by_n and by_n[32]["shutdown"] > SHUTDOWN_32_TARGET:
        found.append(f"shutdown of 32 workers: {by_n[32]['shutdown']:.2f} s > {SHUTDOWN_32_TARGET:g} s")
    sizes = sorted(n for n in by_n if n >= 16)
    for small, big in zip(sizes, sizes[1:]):
        for row in ROWS:
            grew, bound = by_n[big][row] / by_n[small][row], LINEAR_SLACK * big / small
            if grew > bound:
                found.append(f"{LABELS[row]} grew {grew:.1f}x from {small} to {big} workers (at most {bound:.1f}x)")
    return found


def render(results: list[dict]) -> str:
    sizes = [r["n"] for r in results]
    lines = [f"{'local workers':<44}" + "".join(f"{n:>9}" for n in sizes)]
    for row in ROWS:
        fmt = "{:>9.2f}" if row in ("start", "shutdown") else "{:>9.1f}"
        lines.append(f"{LABELS[row]:<44}" + "".join(fmt.format(r[row]) for r in results))
    lines.append(f"{'load average (1 min) during the size':<44}" + "".join(f"{r['load']:>9.1f}" for r in results))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--child", type=int)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    results = [run(int(n)) for n in args.sizes.split(",")]
    print(f"Scale: local workers on {os.cpu_count()} CPUs, a plain script as the driver, warm start")
    print(render(results))
    found = missed(results)
    print("targets (shutdown of 32 under 1 s, linear growth from 16 up): "
          + ("missed: " + "; ".join(found) if found else "met"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
