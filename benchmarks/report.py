"""Print the table of a results file (``make bench`` ends with it; the docs use it too).

    python benchmarks/report.py [RESULTS] [--markdown]

RESULTS defaults to ``benchmarks/results.json``. A missed target shows as ``MISSED``
in its row; the exit status is 0 whenever the file could be read.
"""

from __future__ import annotations

import argparse
import sys

import results as results_file

HEADER = ("row", "unit", "nbrpc", "reference", "ratio", "target", "result")
NUMERIC = {2, 3, 4}


def cells(row: dict) -> list[str]:
    """One row's cells, in the order of ``HEADER``."""
    result = {True: "met", False: "MISSED", None: ""}[row["met"]]
    return [row["what"], row["unit"], number(row["nbrpc"]), number(row["reference"]),
            "" if row["ratio"] is None else f"{row['ratio']:.2f}", row["target"] or "", result]


def number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:#.3g}" if abs(value) < 10 else f"{value:.1f}"


def text_table(rows: list[dict]) -> str:
    lines = [list(HEADER), *map(cells, rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]

    def fmt(line):
        return "  ".join(c.rjust(w) if i in NUMERIC else c.ljust(w)
                         for i, (c, w) in enumerate(zip(line, widths))).rstrip()

    return "\n".join([fmt(lines[0]), fmt(["-" * w for w in widths]), *map(fmt, lines[1:])])


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(" --- " for _ in HEADER) + "|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def heading(results: dict) -> str:
    m = results["machine"]
    spread = results.get("spread")
    return (f"nbrpc {results['nbrpc']}, torch {results['torch']}, {results['date']}, "
            f"{results.get('seconds', 0):.0f} s\n"
            f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; load average "
            f"{m['load_before'][0]:.1f} before, {m['load_after'][0]:.1f} after\n"
            f"spread (the same raw torch code measured twice in the run): "
            f"{'-' if spread is None else f'{spread:.3f}'}")


def summary(results: dict) -> str:
    rows = results["rows"]
    missed = [row["id"] for row in rows if row["met"] is False]
    judged = sum(row["met"] is not None for row in rows)
    lines = [f"{judged - len(missed)} of {judged} targets met" + (f"; missed: {', '.join(missed)}" if missed else "")]
    lines += [f"not run: {what}" for what in results.get("skipped", [])]
    lines += [f"FAILED to run: {what}" for what in results.get("failed", [])]
    return "\n".join(lines)


def render(results: dict, markdown: bool = False) -> str:
    table = markdown_table(results["rows"]) if markdown else text_table(results["rows"])
    return f"{heading(results)}\n\n{table}\n\n{summary(results)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=str(results_file.FILE))
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    print(render(results_file.read(args.results), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
