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

from results import row, write_rows
from usage import pss_mib

ROOT = Path(__file__).resolve().parents[1]


def child(n: int, warm_start: bool) -> None:
    """One driver: cold start, PSS, shutdown, warm start, shutdown; prints JSON."""
    sys.path.insert(0, str(ROOT))
    import nbrpc
    from nbrpc import _bench

    began = time.perf_counter()
    cluster = nbrpc.start(n, progress=None, warm_start=warm_start)
    cold = time.perf_counter() - began
    time.sleep(1.0)  # let start-up allocations settle
    pss = [pss_mib(w.pid) for w in cluster.workers]
    tp = _bench.template_process() if warm_start else None
    template_pss, template_ready = (pss_mib(tp[0]), tp[1]) if tp is not None else (0.0, 0.0)
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
    """Prints the table; ``--json`` writes its rows (``results.py``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--child", choices=["0", "1"])
    args = parser.parse_args()
    if args.child is not None:
        child(args.workers, args.child == "1")
        return 0
    load_before = os.getloadavg()
    torch_s = statistics.median(import_torch() for _ in range(args.runs))
    results = {mode: [run(args.workers, mode == "warm template") for _ in range(args.runs)]
               for mode in ("warm template", "fresh processes")}
    rows = {mode: summarize(rs, args.workers) for mode, rs in results.items()}
    print(f"nbrpc.start(n={args.workers}), median of {args.runs} runs; load average {load_before[0]:.2f} "
          f"before, {os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs")
    print(render(rows, torch_s))
    a, b = rows["warm template"], rows["fresh processes"]
    note = f"n={args.workers}, medians of {args.runs} runs"
    write_rows([row("start_cold", a["cold"], torch_s, note=f"{note}; fresh processes: {b['cold']:.2f} s"),
                row("start_warm", a["warm"], b["warm"], note=note),
                row("pss_worker", a["pss"], b["pss"], note=f"{note}; with the template's share: "
                                                           f"{a['pss_all']:.0f} MiB")], args.json)
    return 0


def summarize(rs: list[dict], n: int) -> dict:
    return {"cold": statistics.median(r["cold"] for r in rs), "warm": statistics.median(r["warm"] for r in rs),
            "pss": statistics.median(statistics.mean(r["pss"]) for r in rs),
            "template_ready": statistics.median(r["template_ready"] for r in rs),
            "pss_all": statistics.median((sum(r["pss"]) + r["template_pss"]) / n for r in rs)}


def render(rows: dict, torch_s: float) -> str:
    a, b = rows["warm template"], rows["fresh processes"]
    label = 'python -c "import torch" (s)'
    return "\n".join([
        f"{'':34}{'warm template':>16}{'fresh processes':>18}",
        f"{label:34}{torch_s:>16.2f}{torch_s:>18.2f}",
        f"{'first cluster, cold (s)':34}{a['cold']:>16.2f}{b['cold']:>18.2f}",
        f"{'  as a multiple of import torch':34}{a['cold'] / torch_s:>15.2f}x{b['cold'] / torch_s:>17.2f}x",
        f"{'  template ready after (s)':34}{a['template_ready']:>16.2f}{'-':>18}",
        f"{'second cluster, warm (s)':34}{a['warm']:>16.2f}{b['warm']:>18.2f}",
        f"{'PSS per worker (MiB)':34}{a['pss']:>16.0f}{b['pss']:>18.0f}",
        f"{'  with the template shared (MiB)':34}{a['pss_all']:>16.0f}{b['pss']:>18.0f}"])

if __name__ == "__main__":
    sys.exit(main())
