"""The side panel's docked views: each one a widget's own front end, fed by the Jupyter
server's endpoint instead of a comm.

Parts:

- ``FRONT_ENDS`` and ``front_end(view)``: which widget shows a view, and its ES module and
  CSS, the very text anywidget sends over a comm (the panel loads it and calls its
  ``render`` with a model of its own).
- ``rref_view``, ``timeline_view``, ``waits_view``, ``autograd_view`` (``(cluster, options)``):
  ``(state, summary)``, where ``state`` is what the view's widget's synced traits would
  hold for the cluster now (the widgets' own ``*_state`` functions draw it), or None when
  there is nothing to draw, and ``summary`` a line saying what is shown or why not.
- ``status_state(rows)``: the status table's state, of the rows the panel asked
  (``panel.Answers`` keeps them fresh); ``stacks_html(cluster)``: the stacks, which are
  text and no widget's, as HTML.

The widgets' modules import anywidget: they are imported when a view is first asked for,
not when ``%load_ext nbrpc`` registers the panel's answers.
"""

from __future__ import annotations

import html
import importlib
from pathlib import Path

from ..cluster import queries
from ..diagnostics import autograd, stacks
from ..diagnostics.rrefs import rref_snapshot
from ..diagnostics.trace import trace_snapshot
from ..drawing import describe, waits_svg
from ..drawing import timeline_layout as tl
from ..drawing import timeline_svg as ts
from ..errors import AutogradContextError

# view -> (module under nbrpc.widgets, widget class): whose front end shows it.
FRONT_ENDS = {
    "rref": ("base", "GraphWidget"), "waits": ("base", "GraphWidget"), "autograd": ("base", "GraphWidget"),
    "timeline": ("timeline", "Timeline"), "status": ("status", "ClusterStatus"),
}
# Seconds of calls a docked timeline shows (the newest, as a live widget follows them).
TIMELINE_LAST = 60


def front_end(view: str) -> dict:
    """``{"esm", "css"}`` of the widget that shows ``view``: its ``_esm`` and ``_css``."""
    module, name = FRONT_ENDS[view]
    widget = getattr(importlib.import_module(f"nbrpc.widgets.{module}"), name)
    return {"esm": _text(widget._esm), "css": _text(widget._css)}


def _text(asset) -> str:
    """An anywidget asset as text: a string, or a file (anywidget's ``FileContents``, whose
    ``str`` is the file's text, or a plain ``Path``)."""
    if isinstance(asset, Path):
        return asset.read_text(encoding="utf-8")
    return str(asset)


def rref_view(cluster, options: dict) -> tuple[dict | None, str]:
    from ..widgets.rref_graph import rref_state

    snap = rref_snapshot()
    return rref_state(snap, show_forks=bool(options.get("show_forks"))), describe.rref_summary(snap)


def timeline_view(cluster, options: dict) -> tuple[dict | None, str]:
    from ..widgets.timeline import timeline_state

    if not cluster.trace:
        return None, "this cluster does not record its calls: start it with %rpc_init --trace"
    snap = trace_snapshot(last=TIMELINE_LAST)
    place = tl.timeline_layout(snap)
    # A docked timeline refreshes as a live one does: it keeps the newest calls in view.
    return {**timeline_state(snap, place), "follow": True}, ts.headline(snap, place)


def waits_view(cluster, options: dict) -> tuple[dict | None, str]:
    from ..widgets.waits_graph import waits_state

    snap = queries.waits(cluster)
    return waits_state(snap), waits_svg.waits_summary(snap)


def autograd_view(cluster, options: dict) -> tuple[dict | None, str]:
    from ..widgets.autograd_graph import autograd_state

    try:
        snap = autograd.last_recorded()
    except AutogradContextError as e:
        return None, str(e)
    return autograd_state(snap), describe.autograd_summary(snap)


def status_state(rows: list[dict]) -> dict:
    """The status table's synced state for ``rows``."""
    from ..widgets.status import status_state

    return status_state(rows)


def stacks_html(cluster) -> tuple[str, str]:
    """Every member's stacks as escaped text in a ``<pre>``, and a summary line."""
    found = queries.stacks(cluster)
    return f"<pre class='nbrpc-stacks'>{html.escape(stacks.format_stacks(found))}</pre>", f"{len(found)} members"
