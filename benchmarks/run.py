"""nbrpc next to raw torch RPC, side by side in one run: ``make bench``.

    python benchmarks/run.py [--quick] [--only PART,...] [--output FILE]

Writes every row to one results file (``results.py``: ``benchmarks/results.json`` by
default) and ends with its table (``report.py``). The parts, in order:

- ``calls``: the in-run comparison (``calls.py``): idle CPU, small ``rpc_sync``, call
  recording and serving, a cell's function, ``rpc.remote``, ``RRef(value)``,
  ``rpc_async`` throughput and 100 MiB round trips, nbrpc clusters and raw torch pairs
  taking turns in short rounds; the second raw ``uv`` pair gives the run's spread.
- ``cuda``: small calls through a device map, where torch sees a GPU (``cuda_calls.py``).
- ``user``: the user's comparison, a Jupyter kernel and a plain script driving nbrpc
  against ``init_rpc`` between two plain processes, whole runs in turns and side by side
  (``user.py``).
- ``startup``, ``server_start``, ``definitions``, ``output``, ``pending``, ``scale``, ``cycles``:
  each a script of this folder that prints its own table and hands its rows over (``--json``).
- ``tutorials``: the wall time of tutorials 01, 02 and 04 run headless.
- ``recording``, ``handoff``, ``cells``: one row group of ``calls`` alone, for a quick look
  (not in the default run, which has them).

``--quick`` runs every part small (a smoke test: the figures mean little). Exit status:
0 when every part ran (a missed target shows in the table, not here; ``gate.py``
compares with the baseline), 1 when a part failed to run.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import call_rows
import calls
import cuda_calls
import processes
import report
import results
import usage

HERE = Path(__file__).resolve().parent
TUTORIALS = ("01_parameter_server", "02_pipeline_parallel", "04_federated_learning")
# Each script's arguments: in the full run, and in a quick one.
SCRIPTS = {
    "startup": (["--runs", "2"], ["--runs", "1", "--workers", "2"]),
    "definitions": (["--calls", "2000"], ["--calls", "200"]),
    "output": (["--calls", "2000"], ["--calls", "200"]),
    "pending": (["--calls", "2000"], ["--calls", "200"]),
    "scale": ([], ["--sizes", "1,2"]),
    "server_start": ([], ["--runs", "1"]),
    "user": ([], ["--runs", "1", "--calls", "100", "--trips", "1", "--turns", "2", "--kind-turns", "2",
                  "--kind-calls", "3"]),
}
DEFAULT = ("calls", "cuda", "user", "startup", "server_start", "definitions", "output", "pending", "scale",
           "tutorials", "cycles")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    args = _parse(argv)
    began, load_before = time.perf_counter(), usage.load()
    rows, failed, skipped, notes = [], [], [], []
    for part in args.only:
        calls.progress(f"part {part}")
        try:
            found, note = PARTS[part](args.quick)
        except Exception as e:  # the other parts still run; the run is marked incomplete
            traceback.print_exc()
            failed.append(f"{part}: {type(e).__name__}: {str(e)[:300]}")
            continue
        rows += found
        if note:
            (skipped if not found else notes).append(f"{part}: {note}")
    spread = next((row["ratio"] for row in rows if row["id"] == "spread"), None)
    document = results.document(rows, spread, load_before, time.perf_counter() - began, skipped)
    document.update(failed=failed, complete=not failed, notes=notes, quick=args.quick)
    results.write(document, args.output)
    print(f"\n{report.render(document)}")
    print("\n".join(["", *notes, f"wrote {args.output}"]))
    return 1 if failed else 0


def calls_part(quick: bool) -> tuple[list[dict], str]:
    found = calls.compare_calls(calls.QUICK if quick else calls.FULL)
    return call_rows.call_rows(found), call_rows.breakdown(found)


def cuda_part(quick: bool) -> tuple[list[dict], str]:
    return cuda_calls.cuda_rows(calls.QUICK if quick else calls.FULL)


def one_cluster_part(kind: str):
    """``recording`` or ``handoff`` alone, in one nbrpc cluster."""
    def part(quick: bool) -> tuple[list[dict], str]:
        sizes = calls.QUICK if quick else calls.FULL
        with processes.nbrpc_cluster(**calls.SETTINGS) as cluster:
            cluster.wait_ready()
            calls.measure(cluster, "latency", 200)
            if kind == "recording":
                found = {"recording": calls.on_off_turns(cluster, "recording", sizes)}
            else:
                found = {"handoff": calls.handoff_turns(cluster, sizes)}
        return call_rows.on_off_rows(found), ""
    return part


def cells_part(quick: bool) -> tuple[list[dict], str]:
    sizes = calls.QUICK if quick else calls.FULL
    with processes.nbrpc_cluster(**calls.SETTINGS) as ours, \
            processes.raw_pair(fast_alloc=True, transport="uv", **calls.SETTINGS) as raw:
        calls.ready(ours, raw)
        return call_rows.cell_rows(calls.cell_calls(ours, raw, sizes)), ""


def script_part(name: str):
    """A script of this folder, its table on our stdout, its rows through a file."""
    def part(quick: bool) -> tuple[list[dict], str]:
        args = SCRIPTS.get(name, ([], []))[quick]
        if name == "cycles":
            args = ["3" if quick else "20"]
        with tempfile.NamedTemporaryFile(suffix=".json") as rows_file:
            command = [sys.executable, str(HERE / f"{name}.py"), *args]
            command += [rows_file.name] if name == "cycles" else ["--json", rows_file.name]
            print(flush=True)
            subprocess.run(command, check=True, timeout=1800)
            return json.loads(Path(rows_file.name).read_text()), ""
    return part


def tutorials_part(quick: bool) -> tuple[list[dict], str]:
    """Wall time of each of ``TUTORIALS`` run headless, top to bottom (``nbrpc run``)."""
    found = []
    for name in TUTORIALS[:1] if quick else TUTORIALS:
        source = HERE.parent / "tutorials" / f"{name}.ipynb"
        output = HERE.parent / "build" / "bench" / f"{name}.ipynb"
        began = time.perf_counter()
        subprocess.run([_nbrpc_command(), "run", str(source), "--output", str(output)],
                       check=True, timeout=600, capture_output=True)
        found.append(results.row(f"tutorial_{name}", time.perf_counter() - began))
    return found, ""


def _nbrpc_command() -> str:
    """The ``nbrpc`` command installed beside this Python (the user's way in)."""
    return str(Path(sys.executable).with_name("nbrpc"))


PARTS = {"calls": calls_part, "cuda": cuda_part, "user": script_part("user"), "tutorials": tutorials_part,
         "recording": one_cluster_part("recording"), "handoff": one_cluster_part("handoff"), "cells": cells_part,
         **{name: script_part(name) for name in ("startup", "server_start", "definitions", "output", "pending", "scale",
                                                 "cycles")}}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every part small: a smoke test")
    parser.add_argument("--only", type=lambda s: s.split(","), default=list(DEFAULT),
                        help=f"parts to run, comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--output", type=Path, default=results.FILE, help="the results file to write")
    args = parser.parse_args(argv)
    unknown = [p for p in args.only if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {', '.join(unknown)}; the parts: {', '.join(PARTS)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
