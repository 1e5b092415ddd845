"""How the costs of a local cluster grow with its size: the scale table.

    python benchmarks/scale.py [--sizes 1,4,16,32,64] [--json FILE]

Each size runs in a fresh driver process (a plain script, as the other benchmarks):
a first ``nbrpc.start(n)`` warms the template and is shut down, then, timed: a warm
``nbrpc.start(n)``; a fan-out round (one small ``rpc_async`` to every worker, then
waiting for all; the median of 20 rounds); ``rref_snapshot()`` with 8 RRefs a worker
(median of 5); ``cluster.status()`` (median of 5); PSS per process (workers and the
driver, ``/proc/PID/smaps_rollup``); and ``shutdown()``. Its rows: shutdown of 32 workers,
and the worst growth of a row from 16 workers up as a multiple of the growth of n
(targets: ``targets.toml``). The big
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

from results import row, write_rows
from usage import pss_mib

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1, 4, 16, 32)
ROWS = ("start", "fanout", "snapshot", "status", "shutdown", "pss")
LABELS = {"start": "warm start (s)", "fanout": "fan-out round, 1 rpc_async a worker (ms)",
          "snapshot": "rref_snapshot, 8 RRefs a worker (ms)", "status": "cluster.status() (ms)",
          "shutdown": "shutdown (s)", "pss": "PSS per process (MiB)"}


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


def scale_rows(results: list[dict]) -> list[dict]:
    """Shutdown of the biggest size of 32 or more, and the worst growth from 16 workers up
    as a multiple of the growth of n."""
    by_n = {r["n"]: r for r in results}
    found = []
    if 32 in by_n:
        found.append(row("scale_shutdown_32", by_n[32]["shutdown"], by_n.get(16, {}).get("shutdown")))
    sizes = sorted(n for n in by_n if n >= 16)
    growth = [(by_n[big][key] / by_n[small][key] / (big / small), f"{LABELS[key]}, {small} to {big}")
              for small, big in zip(sizes, sizes[1:]) for key in ROWS]
    if growth:
        worst, where = max(growth)
        found.append(row("scale_growth", worst, note=f"the worst: {where}"))
    return found


def render(results: list[dict]) -> str:
    sizes = [r["n"] for r in results]
    lines = [f"{'local workers':<44}" + "".join(f"{n:>9}" for n in sizes)]
    for key in ROWS:
        fmt = "{:>9.2f}" if key in ("start", "shutdown") else "{:>9.1f}"
        lines.append(f"{LABELS[key]:<44}" + "".join(fmt.format(r[key]) for r in results))
    lines.append(f"{'load average (1 min) during the size':<44}" + "".join(f"{r['load']:>9.1f}" for r in results))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", type=int)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    results = [run(int(n)) for n in args.sizes.split(",")]
    print(f"Scale: local workers on {os.cpu_count()} CPUs, a plain script as the driver, warm start")
    print(render(results))
    write_rows(scale_rows(results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
