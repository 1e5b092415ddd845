"""What a driver keeps across clusters: start a 2-worker cluster, make one call,
shut it down, 20 times; print the driver's open descriptors, resident memory and
threads after each shutdown (``make bench`` runs it; also
``python benchmarks/cycles.py [CYCLES] [ROWS_JSON]``). Its rows: the growth from the first
shutdown to the last (targets: ``targets.toml``).
The driver runs in a fresh child process, so nothing else this run did counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from results import row, write_rows

HERE = Path(__file__).resolve().parent

CYCLES = 20

DRIVER = """
import json, os, sys
import torch.distributed.rpc as rpc
import nbrpc
from usage import process_usage

for cycle in range(int(sys.argv[1])):
    cluster = nbrpc.start(2, progress=None)
    assert rpc.rpc_sync("worker1", os.getpid) == cluster.workers[0].pid
    cluster.shutdown()
    print(json.dumps({"cycle": cycle + 1, **process_usage()}), flush=True)
"""


def measure(cycles: int = CYCLES) -> list[dict]:
    """One row per cycle: descriptors, rss_mib, threads of the driver after shutdown."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(cycles)], capture_output=True, cwd=HERE,
                          text=True, timeout=60 * cycles)
    if proc.returncode != 0:
        raise RuntimeError(f"the cycling driver failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def report(rows: list[dict]) -> dict:
    """Print the rows and the growth; return the growth."""
    print(f"\nDriver across {len(rows)} cluster cycles (after each shutdown)")
    print(f"{'cycle':>5} {'descriptors':>11} {'RSS MiB':>8} {'threads':>7}")
    for r in rows:
        print(f"{r['cycle']:>5} {r['descriptors']:>11} {r['rss_mib']:>8.1f} {r['threads']:>7}")
    first, last = rows[0], rows[-1]
    growth = {k: last[k] - first[k] for k in ("descriptors", "rss_mib", "threads")}
    print(f"growth from cycle 1 to {last['cycle']}: {growth['descriptors']:+d} descriptors, "
          f"{growth['rss_mib']:+.1f} MiB, {growth['threads']:+d} threads")
    return growth


def cycle_rows(growth: dict, cycles: int = CYCLES) -> list[dict]:
    note = f"from the first shutdown to the last of {cycles}; threads {growth['threads']:+d}"
    return [row("cycles_descriptors", growth["descriptors"], note=note),
            row("cycles_memory", growth["rss_mib"], note=note)]


def main() -> int:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else CYCLES
    growth = report(measure(cycles))
    write_rows(cycle_rows(growth, cycles), sys.argv[2] if len(sys.argv) > 2 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
