"""What a driver keeps across clusters: start a 2-worker cluster, make one call,
shut it down, 20 times; print the driver's open descriptors, resident memory and
threads after each shutdown (``make bench`` runs it; also ``python benchmarks/cycles.py``).

Target: growth from the first shutdown to the last within 10 descriptors and 20 MB.
The driver runs in a fresh child process, so nothing else this run did counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

CYCLES = 20
TARGET_FDS, TARGET_MB = 10, 20.0

DRIVER = """
import json, os, sys
import torch.distributed.rpc as rpc
import nbrpc
from nbrpc._util import process_usage

for cycle in range(int(sys.argv[1])):
    cluster = nbrpc.start(2, progress=None)
    assert rpc.rpc_sync("worker1", os.getpid) == cluster.workers[0].pid
    cluster.shutdown()
    print(json.dumps({"cycle": cycle + 1, **process_usage()}), flush=True)
"""


def measure(cycles: int = CYCLES) -> list[dict]:
    """One row per cycle: descriptors, rss_mb, threads of the driver after shutdown."""
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(cycles)], capture_output=True,
                          text=True, timeout=60 * cycles)
    if proc.returncode != 0:
        raise RuntimeError(f"the cycling driver failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def report(rows: list[dict]) -> bool:
    """Print the rows and the growth; return whether the growth is within the target."""
    print(f"\nDriver across {len(rows)} cluster cycles (after each shutdown)")
    print(f"{'cycle':>5} {'descriptors':>11} {'RSS MB':>8} {'threads':>7}")
    for r in rows:
        print(f"{r['cycle']:>5} {r['descriptors']:>11} {r['rss_mb']:>8.1f} {r['threads']:>7}")
    first, last = rows[0], rows[-1]
    growth = {k: last[k] - first[k] for k in ("descriptors", "rss_mb", "threads")}
    ok = growth["descriptors"] <= TARGET_FDS and growth["rss_mb"] <= TARGET_MB
    print(f"growth from cycle 1 to {last['cycle']}: {growth['descriptors']:+d} descriptors, "
          f"{growth['rss_mb']:+.1f} MB, {growth['threads']:+d} threads "
          f"(target: within {TARGET_FDS} descriptors and {TARGET_MB:g} MB: {'met' if ok else 'MISSED'})")
    return ok


def main() -> int:
    """0 when the target is met, 1 when it is missed."""
    return 0 if report(measure()) else 1


if __name__ == "__main__":
    sys.exit(main())
