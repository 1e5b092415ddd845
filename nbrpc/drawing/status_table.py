"""The ``%rpc_status`` table: an HTML table in a notebook, aligned text elsewhere.

Headless (no IPython): the magic returns it, and the status widget draws it.
"""

from __future__ import annotations

import html

STATUS_COLUMNS = ("name", "rank", "host", "pid", "state", "devices", "busy", "owned_rrefs")


class StatusTable:
    """Rows of ``Cluster.status()``, shown through ``__repr__`` and ``_repr_html_``."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    @property
    def columns(self) -> tuple[str, ...]:
        # Workers in a batch job (Slurm) add its id.
        return STATUS_COLUMNS + (("job",) if any(row.get("job") for row in self.rows) else ())

    def _cells(self) -> list[list[str]]:
        return [["-" if row.get(c) is None else str(row[c]) for c in self.columns] for row in self.rows]

    def __repr__(self) -> str:
        table = [list(self.columns), *self._cells()]
        widths = [max(len(r[i]) for r in table) for i in range(len(self.columns))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in cells) + "</tr>"
            for cells in self._cells()
        )
        return f'<table class="nbrpc-status"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
