"""For teachers: fill a lab notebook with its solutions, or grade a notebook headless.

Also on the command line, as ``python -m nbrpc.lab solve`` and ``python -m nbrpc.lab grade``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path


def read_solutions(path) -> dict[str, str]:
    """Sections of a solutions file: ``# %% lab.exercise`` lines start each one."""
    parts = re.split(r"(?m)^# %% ([\w.]+)[ \t]*\n", Path(path).read_text())
    return {name: body.strip() + "\n" for name, body in zip(parts[1::2], parts[2::2])}


def solve(notebook, solutions=None):
    """The lab ``notebook`` with its exercise cells replaced by the reference solutions.

    ``solutions`` defaults to ``solutions/<notebook stem>.py`` next to the notebook.
    Exercise cells carry ``"exercise": "lab.name"`` in their metadata.
    """
    import nbformat

    notebook = Path(notebook)
    answers = read_solutions(solutions or notebook.parent / "solutions" / f"{notebook.stem}.py")
    nb = nbformat.read(notebook, as_version=4)
    cells = {c.metadata["exercise"]: c for c in nb.cells if "exercise" in c.metadata}
    unmatched = sorted(set(cells) ^ set(answers))
    if unmatched:
        raise ValueError(f"exercise cells and solutions do not match: {', '.join(unmatched)}")
    for name, cell in cells.items():
        cell.source = answers[name].rstrip("\n")
    return nb


def grade(notebook, timeout: int = 600) -> list[str]:
    """Run ``notebook`` in a fresh kernel; return its check lines, summary and errors."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(notebook)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    lines = []
    for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        checks = re.search(r"\blab\.(check|summary)\(", cell.source)
        for output in cell.outputs:
            if output.output_type == "error":
                lines.append(f"code cell {index + 1} raised {output.ename}: {output.evalue}")
            elif output.output_type == "stream" and checks:
                lines.extend(output.text.rstrip("\n").splitlines())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbrpc.lab", description="Lab notebooks: "
                                     "fill in the reference solutions, or grade a notebook.")
    commands = parser.add_subparsers(dest="command", required=True)
    solving = commands.add_parser("solve", help="write the notebook with its solutions filled in")
    solving.add_argument("notebook")
    solving.add_argument("-o", "--output", required=True)
    solving.add_argument("--solutions", help="default: solutions/NAME.py next to the notebook")
    grading = commands.add_parser("grade", help="run a notebook in a fresh kernel, print its "
                                  "checks and score; exit status 0 if every exercise passes")
    grading.add_argument("notebook")
    grading.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = parser.parse_args(argv)
    if args.command == "solve":
        import nbformat

        try:
            solved = solve(args.notebook, args.solutions)
        except (OSError, ValueError) as e:
            parser.error(str(e))
        nbformat.write(solved, args.output)
        print(f"wrote {args.output}")
        return 0
    lines = grade(args.notebook, args.timeout)
    print("\n".join(lines))
    return 0 if _all_pass(lines) else 1


def _all_pass(lines: list[str]) -> bool:
    """Whether graded ``lines`` end in a full score, with no cell raising on the way."""
    tallies = [m for m in map(re.compile(r": (\d+) of (\d+) exercises pass$").search, lines) if m]
    crashed = any(re.match(r"code cell \d+ raised ", line) for line in lines)
    return bool(tallies) and tallies[-1][1] == tallies[-1][2] and not crashed

