"""The regression gate: a run against the last accepted run, failing only where a row got
worse by more than the runs' own spread (``make bench-gate``).

    python benchmarks/gate.py [RESULTS] [--baseline benchmarks/baseline.json]
    python benchmarks/gate.py [RESULTS] --accept "why the new level is right"

The baseline is the last run someone accepted, with the reason (its ``accepted``: date and
why), not a copy of each new run: ``make bench`` rewrites ``results.json`` only, and the
gate judges it against ``baseline.json``. ``--accept`` makes a run the new baseline, in
the change that explains it (a gate that failed for a reason, a deliberate trade).

How it decides, row by row (rows are matched by ``id``):

- The tolerance is the larger spread of the two files, as a fraction: a spread of 1.04 or
  of 0.96 (the same raw torch code measured twice in one run) allows 4%. A row measured
  by whole runs taking turns brings its own spread, and the larger one counts.
- A row of the in-run comparison or the user's comparison (``gate = "ratio"`` in
  ``targets.toml``, the default) with a ratio in both files is compared by its ratio,
  which is measured against a reference in the same run and so carries over from one
  run (and machine) to the next: it got worse when it moved the wrong way (``better``)
  by more than the tolerance.
- Any other row (``gate = "target"``: measured by a script of its own or from a few
  samples, whose noise the spread does not measure), and a row whose baseline ratio is
  0 or missing, got worse when the baseline met its target and the run misses it by
  more than the tolerance.
- Rows in only one of the files are listed, not judged.

Exit status: 1 when a row got worse, 0 otherwise (targets missed in both are the
table's business, not the gate's); a run that is the baseline itself (the same ``date``)
is said to be, as it proves nothing.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import results as results_file
import targets

BASELINE = Path(__file__).resolve().with_name("baseline.json")


def tolerance(*spreads: float | None) -> float:
    """The largest spread as a fraction (1.04 and 0.96 both allow 0.04)."""
    found = [max(s, 1 / s) - 1 for s in spreads if s]
    return max(found, default=0.0)


def judge(row: dict, base: dict, allowed: float, by: str = "ratio") -> tuple[str, float | None]:
    """("worse" | "same" | "not compared", how much worse as a fraction); ``by``: the
    row's ``gate`` in ``targets.toml``."""
    allowed = max(allowed, tolerance(row.get("spread"), base.get("spread")))
    new, old = row.get("ratio"), base.get("ratio")
    if row.get("better") == "none":
        return "not compared", None
    if by == "ratio" and new is not None and old:
        worse = new / old - 1 if row["better"] == "lower" else old / new - 1 if new else float("inf")
        return ("worse" if worse > allowed else "same"), worse
    if base.get("met") is True and row.get("met") is False:
        beyond = _beyond(row)
        return ("worse" if beyond > allowed else "same"), beyond
    return ("same" if row.get("met") is not None and base.get("met") is not None else "not compared"), None


def _beyond(row: dict) -> float:
    """How far a row misses its target (``ratio <= 1.05``), as a fraction of the bound."""
    of, sense, bound = row["target"].split()
    value = row["nbrpc"] - (row.get("reference") or 0.0) if of == "difference" else row[of]
    if sense == "<=":
        return value / float(bound) - 1 if float(bound) else float("inf")
    return float(bound) / value - 1 if value else float("inf")


def compare(run: dict, baseline: dict) -> tuple[list[dict], list[str]]:
    """One verdict per row present in both; and the rows only one file has."""
    allowed = tolerance(run.get("spread"), baseline.get("spread"))
    rules = targets.load()
    old = {row["id"]: row for row in baseline["rows"]}
    new = {row["id"]: row for row in run["rows"]}
    verdicts = []
    for key, row in new.items():
        if key in old:
            verdict, worse = judge(row, old[key], allowed, rules[key].gate if key in rules else "ratio")
            verdicts.append({"id": key, "baseline": old[key].get("ratio"), "now": row.get("ratio"),
                             "worse": worse, "allowed": max(allowed, tolerance(row.get("spread"),
                                                                                old[key].get("spread"))),
                             "verdict": verdict})
    unmatched = [f"only in the run: {k}" for k in new if k not in old]
    unmatched += [f"only in the baseline: {k}" for k in old if k not in new]
    return verdicts, unmatched


def render(verdicts: list[dict], unmatched: list[str]) -> str:
    lines = [f"{'row':<32} {'baseline':>9} {'now':>9} {'worse by':>9} {'allowed':>8}  verdict"]
    for v in verdicts:
        worse = "" if v["worse"] is None else f"{v['worse']:+.1%}"
        lines.append(f"{v['id']:<32} {_ratio(v['baseline']):>9} {_ratio(v['now']):>9} {worse:>9} "
                     f"{v['allowed']:>8.1%}  {v['verdict'].upper() if v['verdict'] == 'worse' else v['verdict']}")
    return "\n".join(lines + unmatched)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def accept(run: dict, why: str, path: Path) -> dict:
    """Write ``run`` as the baseline at ``path``, with the date and the reason it was accepted."""
    if not why.strip():
        raise SystemExit("--accept needs the reason the new level is right (it is kept in the baseline)")
    if not run.get("complete") or run.get("quick"):
        raise SystemExit("only a complete, full run (make bench, not --quick or --only) can be the baseline")
    baseline = {**run, "accepted": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "why": why.strip()}}
    results_file.write(baseline, Path(path))
    return baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=str(results_file.FILE))
    parser.add_argument("--baseline", default=str(BASELINE))
    parser.add_argument("--accept", metavar="WHY", help="make the run the baseline, for this reason")
    args = parser.parse_args(argv)
    run = results_file.read(args.results)
    if args.accept is not None:
        accept(run, args.accept, args.baseline)
        print(f"gate: {args.results} ({run.get('date')}) is the baseline now")
        return 0
    baseline = results_file.read(args.baseline)
    if run.get("date") == baseline.get("date"):
        print(f"gate: the run is the baseline itself ({run.get('date')}), accepted "
              f"{baseline.get('accepted', {}).get('date', 'at some time')}: nothing to judge; run make bench first")
    verdicts, unmatched = compare(run, baseline)
    print(render(verdicts, unmatched))
    worse = [v["id"] for v in verdicts if v["verdict"] == "worse"]
    print(f"\ngate: {len(worse)} row{'s' * (len(worse) != 1)} worse than the baseline beyond the spread"
          + (f": {', '.join(worse)}" if worse else ""))
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
