"""The results file ``make bench`` writes (``benchmarks/results.json``), one schema for every row.

    {"machine": {"cpu", "cores", "memory_gib", "platform", "python", "load_before", "load_after"},
     "torch": version, "nbrpc": version, "date": ISO 8601 (UTC), "seconds": the run's wall time,
     "spread": the ratio of two measurements of the same raw torch code in this run,
     "complete": whether every part ran, "skipped": [what did not run, and why],
     "rows": [{"id", "what", "unit", "nbrpc", "reference", "reference_name", "ratio",
               "target", "met", "reason", "better", "note", "spread"}]}

A row's ``ratio`` reads as its target says (``targets.toml``: nbrpc/reference, or
reference/nbrpc for rates and speed-ups); ``target`` is its text (``ratio <= 1.05``) or
"" without one; ``met`` is None without a target; ``better`` is "lower" or "higher" (the gate's
direction); ``note`` says how the row was measured in this run; ``spread``, where
present, is the row's own spread (whole runs taking turns), which the gate also allows.
The baseline (``baseline.json``) is such a file with one more key, ``accepted``: ``{"date",
"why"}``, written by ``gate.py --accept``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import psutil
import targets as target_table
import usage

HERE = Path(__file__).resolve().parent
FILE = HERE / "results.json"
TARGETS = target_table.load()


def row(id: str, nbrpc: float | None, reference: float | None = None, *, ratio: float | None = None,
        note: str | None = None, spread: float | None = None) -> dict:
    """One row, its label, target and reason from ``targets.toml``; ``ratio`` when it is
    computed otherwise than from the two values (the median of paired rounds' ratios)."""
    target = TARGETS[id]
    if ratio is None:
        ratio = target.ratio(nbrpc, reference)
    found = {"id": id, "what": target.what, "unit": target.unit, "nbrpc": _number(nbrpc),
             "reference": _number(reference), "reference_name": target.reference_name,
             "ratio": _number(ratio), "target": target.text() or "", "met": target.met(nbrpc, reference, ratio),
             "reason": target.reason, "better": target.better, "note": note}
    if spread is not None:
        found["spread"] = _number(spread)
    return found


def _number(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.6g}")


def machine(load_before: list[float]) -> dict:
    """What ran it: CPU model, cores, memory, and the load average before and after."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_before": load_before, "load_after": usage.load()}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def document(rows: list[dict], spread: float | None, load_before: list[float], seconds: float,
             skipped: list[str]) -> dict:
    """The whole results file."""
    import torch

    import nbrpc

    return {"machine": machine(load_before), "torch": torch.__version__,
            "nbrpc": getattr(nbrpc, "__version__", None) or _installed_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "seconds": round(seconds, 1), "spread": _number(spread), "complete": not skipped,
            "skipped": skipped, "rows": rows}


def _installed_version() -> str:
    from importlib.metadata import version

    return version("nbrpc")


def write(results: dict, path: Path = FILE) -> None:
    path.write_text(json.dumps(results, indent=1) + "\n")


def read(path: Path = FILE) -> dict:
    """A results file; a clear error when it is not one."""
    try:
        results = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"{path}: no results file; `make bench` writes one") from None
    except json.JSONDecodeError as e:
        raise SystemExit(f"{path}: not JSON ({e}); write it again with `make bench`") from None
    if not isinstance(results, dict) or "rows" not in results:
        raise SystemExit(f"{path}: no \"rows\"; not a results file of `make bench`")
    return results


def write_rows(rows: list[dict], path: str | None) -> None:
    """What a benchmark script hands to ``run.py`` (``--json FILE``)."""
    if path:
        Path(path).write_text(json.dumps(rows, indent=1) + "\n")
