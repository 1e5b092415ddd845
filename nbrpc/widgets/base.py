"""What the RRef and autograd graphs share: the model, the front end, the static fallback.

``GraphWidget`` is an anywidget whose synced traits hold what Python drew: ``svg`` (from
``svg.py``) and ``details`` (from ``describe.py``). ``graph.js`` shows them and adds
the interaction, syncing ``selected``, ``worker`` and ``show_forks`` back. Displayed,
a graph's mimebundle carries the widget view plus ``text/html`` (the same SVG, made
for static viewers) and a ``text/plain`` summary; with no widget state stored in the
notebook, GitHub, nbviewer and nbval show the SVG.
"""

from __future__ import annotations

import os
from pathlib import Path

import anywidget
import traitlets

from ..drawing.report import front_end_script as esm
from ..drawing.svg import THEME_CSS
from ._live import LiveView, SyncLock

HERE = Path(__file__).parent


class StaticView:
    """A graph as static HTML and text only (``%rref_graph --static``, saved notebooks)."""

    def __init__(self, svg: str, summary: str):
        self.svg, self.summary = svg, summary

    def _repr_mimebundle_(self, include=None, exclude=None):
        from ..drawing.svg import static_html

        return {"text/plain": self.summary, "text/html": static_html(self.svg, self.summary)}

    def __repr__(self) -> str:
        return self.summary


class GraphWidget(SyncLock, anywidget.AnyWidget):
    """Base of ``RRefGraph`` and ``AutogradGraph``: Python draws, ``graph.js`` interacts."""

    _esm = esm("graph.js")
    _css = (HERE / "graph.css").read_text(encoding="utf-8") + THEME_CSS

    kind = traitlets.Unicode("rref", help="which graph: rref or autograd").tag(sync=True)
    svg = traitlets.Unicode("", help="the drawing, made by nbrpc.drawing.svg").tag(sync=True)
    details = traitlets.Dict(help="hover details by item id: {title, rows}").tag(sync=True)
    selected = traitlets.Unicode(
        "", help="id of the item pinned by a click in the front end ('' for none)").tag(sync=True)
    worker = traitlets.Unicode(
        "", help="show only items that concern this worker ('' for all)").tag(sync=True)
    show_forks = traitlets.Bool(False, help="draw fork history (RRef graph)").tag(sync=True)
    fit = traitlets.Bool(True, help="shrink the drawing to the output's width (else 1:1)").tag(sync=True)
    status = traitlets.Unicode(
        "", help="one line under the toolbar: what is shown, live or not").tag(sync=True)

    def _set_status(self, text: str) -> None:
        with self._sync_lock():
            self.status = text

    def summary(self) -> str:
        """What ``text/plain`` shows."""
        raise NotImplementedError

    def to_svg(self) -> str:
        """The graph as a standalone SVG document (what static viewers show)."""
        raise NotImplementedError

    def static(self) -> StaticView:
        return StaticView(self.to_svg(), self.summary())

    def save(self, path: str | os.PathLike) -> Path:
        """Write the static graph: ``.svg`` as SVG, any other suffix as an HTML page."""
        path = Path(path)
        drawing = self.to_svg()
        if path.suffix.lower() == ".svg":
            text = '<?xml version="1.0" encoding="UTF-8"?>\n' + drawing + "\n"
        else:
            from ..drawing.svg import static_html

            text = ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>nbrpc</title></head>"
                    f"<body>{static_html(drawing, self.summary())}</body></html>\n")
        path.write_text(text, encoding="utf-8")
        return path

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        static = self.static()._repr_mimebundle_()
        if bundle is None:  # a model without a view
            return static
        data, metadata = bundle
        return {**data, **static}, metadata


class LiveGraph(LiveView, GraphWidget):
    """A graph that refreshes itself, its status line saying so (RRef and wait-for graphs)."""

    def _headline(self) -> str:
        return self.summary()

    def _show(self, text: str, following: bool) -> None:
        self._set_status(text)

    def _status_line(self) -> str:
        if self.live:
            return f"live, every {self.interval:g} s: {self.summary()}"
        return self.summary()
