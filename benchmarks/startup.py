"""Start-up of a local cluster: warm template against fresh processes, next to ``import torch``.

    python benchmarks/startup.py [--workers 4] [--runs 3]

Each run is a fresh driver process (as a new kernel is): it times its first
``nbrpc.start(n)`` (cold: it includes starting the template), reads every worker's
PSS (``/proc/PID/smaps_rollup``: shared pages are split among the processes that
share them), shuts down, then times a second ``nbrpc.start(n)`` (warm). The same
again with ``warm_start=False`` (every worker a fresh Python). Prints medians side by
side with the machine's load average, which matters on a shared machine.
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
TARGET_WARM, TARGET_COLD_RATIO, TARGET_PSS = 1.0, 1.3, 120.0


def pss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(n: int, warm_start: bool) -> None:
    """One driver: cold start, PSS, shutdown, warm start, shutdown; prints JSON."""
    sys.path.insert(0, str(ROOT))
    import nbrpc
    from nbrpc.launchers import template

    began = time.perf_counter()
    cluster = nbrpc.start(n, progress=None, warm_start=warm_start)
    cold = time.perf_counter() - began
    time.sleep(1.0)  # let start-up allocations settle
    pss = [pss_mib(w.pid) for w in cluster.workers]
    tp = template.current()
    template_pss = pss_mib(tp.pid) if warm_start and tp is not None else 0.0
    template_ready = tp.ready_after if warm_start and tp is not None else 0.0
    cluster.shutdown()
    began = time.perf_counter()
    cluster = nbrpc.start(n, progress=None, warm_start=warm_start)
    warm = time.perf_counter() - began
    cluster.shutdown()
    print(json.dumps({"cold": cold, "warm": warm, "pss": pss, "template_pss": template_pss,
                      "template_ready": template_ready}))


def import_torch() -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - began


def run(n: int, warm_start: bool) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", "1" if warm_start else "0", "--workers", str(n)],
                         check=True, capture_output=True, text=True, cwd=ROOT, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    """Prints the table; returns 1 when the warm template misses a target, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", choices=["0", "1"])
    args = parser.parse_args()
    if args.child is not None:
        child(args.workers, args.child == "1")
        return 0
    load_before = os.getloadavg()
    torch_s = statistics.median(import_torch() for _ in range(args.runs))
    results = {mode: [run(args.workers, mode == "warm template") for _ in range(args.runs)]
               for mode in ("warm template", "fresh processes")}
    load_after = os.getloadavg()
    n = args.workers
    print(f"nbrpc.start(n={n}), median of {args.runs} runs; load average {load_before[0]:.2f} "
          f"before, {load_after[0]:.2f} after, {os.cpu_count()} CPUs")
    print(f"{'':34}{'warm template':>16}{'fresh processes':>18}{'target':>12}")
    rows = {mode: {
        "cold": statistics.median(r["cold"] for r in rs),
        "warm": statistics.median(r["warm"] for r in rs),
        "pss": statistics.median(statistics.mean(r["pss"]) for r in rs),
        "template_ready": statistics.median(r["template_ready"] for r in rs),
        "pss_all": statistics.median((sum(r["pss"]) + r["template_pss"]) / n for r in rs),
    } for mode, rs in results.items()}
    a, b = rows["warm template"], rows["fresh processes"]
    label = 'python -c "import torch" (s)'
    print(f"{label:34}{torch_s:>16.2f}{torch_s:>18.2f}{'':>12}")
    print(f"{'first cluster, cold (s)':34}{a['cold']:>16.2f}{b['cold']:>18.2f}"
          f"{f'<= {TARGET_COLD_RATIO * torch_s:.2f}':>12}")
    print(f"{'  as a multiple of import torch':34}{a['cold'] / torch_s:>15.2f}x{b['cold'] / torch_s:>17.2f}x"
          f"{f'<= {TARGET_COLD_RATIO}x':>12}")
    print(f"{'  template ready after (s)':34}{a['template_ready']:>16.2f}{'-':>18}{'':>12}")
    print(f"{'second cluster, warm (s)':34}{a['warm']:>16.2f}{b['warm']:>18.2f}{f'<= {TARGET_WARM}':>12}")
    print(f"{'PSS per worker (MiB)':34}{a['pss']:>16.0f}{b['pss']:>18.0f}{f'<= {TARGET_PSS:.0f}':>12}")
    print(f"{'  with the template shared (MiB)':34}{a['pss_all']:>16.0f}{b['pss']:>18.0f}{'':>12}")
    missed = [what for what, ok in (("cold start", a["cold"] <= TARGET_COLD_RATIO * torch_s),
                                    ("warm start", a["warm"] <= TARGET_WARM),
                                    ("PSS per worker", a["pss"] <= TARGET_PSS)) if not ok]
    print(f"targets (warm template): {'missed: ' + ', '.join(missed) if missed else 'met'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
