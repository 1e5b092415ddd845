"""The nbrpc side: the differential check's modules as a notebook's cells, in a real
nbrpc cluster. ``messages`` and ``scenarios`` run in the driver's ``__main__`` (their
functions travel by value, as a notebook's do); ``scripted`` runs on every member too,
as torch's docstrings have TorchScript functions defined ("On both workers")."""

from __future__ import annotations

import ast
import json
from pathlib import Path

HERE = Path(__file__).parent


def cell(module: str) -> str:
    """``module``'s source as a cell: its imports from ``differential`` left out (the
    cells they name ran before)."""
    source = (HERE / f"{module}.py").read_text()
    lines = source.splitlines(keepends=True)
    for node in reversed(ast.parse(source).body):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("differential"):
            del lines[node.lineno - 1:node.end_lineno]
    return "".join(lines)


class Notebook:
    """The cells run on ``cluster`` from ``shell`` (IPython's, as the kernel's ``__main__``);
    ``ask(request)`` gives the driver's answer, as JSON gives it back."""

    def __init__(self, shell, cluster, run):
        run(shell, cell("messages"))
        scripted = cell("scripted")
        run(shell, scripted)
        cluster.run(scripted, targets="all")
        run(shell, cell("scenarios"))
        self.answer = shell.user_ns["answer"]

    def ask(self, request: dict) -> dict:
        return json.loads(json.dumps(self.answer(request)))
