"""``Timeline``: every RPC of a trace where and when it ran, following a cell live."""

from __future__ import annotations

import os
from pathlib import Path

import anywidget
import traitlets

from ..cluster.cluster import current
from ..diagnostics.trace import trace_snapshot
from ..drawing import timeline_layout as tl
from ..drawing import timeline_svg as ts
from ..drawing.svg import THEME_CSS
from ..errors import NoClusterError
from ._live import LiveView, SyncLock
from .base import HERE, esm


def running_recording(last: float | None = None) -> dict:
    """The running cluster's recording (``nbrpc.trace_snapshot``), for ``source=None``."""
    if current() is None:
        raise NoClusterError(
            "no cluster is running, so there is no recording to show; start one with "
            "%rpc_init --trace (or nbrpc.start(trace=True)), or pass a trace: "
            "with nbrpc.trace() as t: ..., then nbrpc.Timeline(t)")
    return trace_snapshot(last=last)


def timeline_state(snapshot: dict, place: tl.TimelineLayout) -> dict:
    """What ``timeline.js`` reads of a timeline showing ``snapshot`` laid out as ``place``
    (the widget's synced traits, the side panel's docked view)."""
    details = ts.busy_details(place) if place.aggregated else ts.call_details(snapshot)
    return {"svg": ts.draw(snapshot, place, titles=False), "details": details, "table": ts.summary_html(snapshot)}


class TimelineStatic:
    """A timeline as static HTML and text only (saved notebooks, ``%rpc_timeline --static``)."""

    def __init__(self, snapshot: dict, threads: bool = False, aggregate_above: int | None = tl.AGGREGATE_ABOVE):
        self.snapshot = snapshot
        self.place = tl.timeline_layout(snapshot, threads=threads, aggregate_above=aggregate_above)
        self.svg = ts.draw(snapshot, self.place)

    def summary(self) -> str:
        return ts.summary_text(self.snapshot, self.place)

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.summary(), "text/html": ts.static_html(self.snapshot, self.svg, self.place)}

    def __repr__(self) -> str:
        return self.summary()


class Timeline(LiveView, SyncLock, anywidget.AnyWidget):
    """The RPC timeline: one lane per member, a bar per call where it ran.

    Bars are coloured by function; thin lines go from the caller at ``sent`` to the
    bar and back at ``replied``. Wheel to zoom, drag to pan, double-click to see it
    all; hover a bar for the call's details (queueing delay, bytes, context, error);
    click to pin it (its id is ``selected``). A table per function and callee sits
    under it.

    Parameters
    ----------
    source
        A trace (``with nbrpc.trace() as t``), a ``TraceSnapshot`` dict, or None for
        the running cluster's recording (a cluster started with ``trace=True``).
    last
        Show only the calls sent in the last ``last`` seconds.
    live
        Refresh every ``interval`` seconds, also while a cell runs, following the
        newest calls, until the cluster stops or the widget is closed.
    threads
        One lane per thread of the callee that ran calls, instead of one per member.
    aggregate_above
        Above this many calls, draw each lane's busy share over time instead of bars.
    """

    _esm = esm("timeline.js")
    _css = (HERE / "timeline.css").read_text(encoding="utf-8") + THEME_CSS

    svg = traitlets.Unicode("", help="the drawing, made by nbrpc.drawing.timeline_svg").tag(sync=True)
    details = traitlets.Dict(help="hover details by call id: {title, rows}").tag(sync=True)
    table = traitlets.Unicode("", help="the summary per function and callee, as HTML").tag(sync=True)
    selected = traitlets.Unicode(
        "", help="id of the call pinned by a click in the front end ('' for none)").tag(sync=True)
    status = traitlets.Unicode("", help="one line over the timeline: what is shown, live or not").tag(sync=True)
    follow = traitlets.Bool(False, help="live: keep the newest calls in view").tag(sync=True)
    fit = traitlets.Bool(True, help="shrink the drawing to the output's width (else 1:1)").tag(sync=True)
    interval = traitlets.Float(1.0, help="seconds between refreshes while live")
    THREAD = "nbrpc-timeline"
    START_HINT = "start one with %rpc_init --trace"

    def __init__(self, source=None, last: float | None = None, live: bool = False, threads: bool = False,
                 *, interval: float = 1.0, aggregate_above: int | None = tl.AGGREGATE_ABOVE, **kwargs):
        if last is not None and not last > 0:
            raise ValueError(f"last must be a positive number of seconds, got {last!r}")
        self._fetch, self._cluster = self._source(source, last, live)
        self._last, self._threads, self._aggregate_above = last, threads, aggregate_above
        snapshot = tl.window(self._fetch(), last)  # before the widget opens: a bad source opens none
        super().__init__(interval=interval, **kwargs)
        self.update(snapshot)
        if live:
            self.start()

    @staticmethod
    def _source(source, last, live):
        if isinstance(source, dict):
            if live:
                raise ValueError("a TraceSnapshot dict cannot refresh: pass the trace itself "
                                 "(with nbrpc.trace() as t: ...; nbrpc.Timeline(t, live=True)) or "
                                 "source=None for the running cluster's recording")
            return (lambda: source), None
        if source is None:
            running_recording(last)  # fails now, with what to do, if there is none
            return (lambda: running_recording(last)), current()
        if callable(getattr(source, "snapshot", None)):
            return source.snapshot, current()
        raise TypeError(f"Timeline shows a trace (nbrpc.trace()), a TraceSnapshot dict or None "
                        f"(the running cluster's recording), not {type(source).__name__}")

    # -- data ------------------------------------------------------------------------

    def update(self, snapshot: dict) -> None:
        """Show ``snapshot``; the front end swaps the drawing in place and keeps its zoom."""
        place = tl.timeline_layout(snapshot, threads=self._threads, aggregate_above=self._aggregate_above)
        state = timeline_state(snapshot, place)
        with self._sync_lock(), self.hold_sync():
            self.snapshot, self.place = snapshot, place
            self.svg, self.details, self.table = state["svg"], state["details"], state["table"]
            self.status = self._status_line()

    def refresh(self) -> None:
        """Take a new snapshot now."""
        self.update(tl.window(self._fetch(), self._last))

    def summary(self) -> str:
        return ts.summary_text(self.snapshot, self.place)

    def static(self) -> TimelineStatic:
        return TimelineStatic(self.snapshot, self._threads, self._aggregate_above)

    def to_svg(self) -> str:
        return self.static().svg

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``.svg`` as the drawing, any other suffix as ``write_report``'s page."""
        path = Path(path)
        if path.suffix.lower() == ".svg":
            path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n' + self.to_svg() + "\n", encoding="utf-8")
        else:
            from ..drawing.report import write_report

            write_report(self.snapshot, path, threads=self._threads)
        return path

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        static = self.static()._repr_mimebundle_()
        if bundle is None:
            return static
        data, metadata = bundle
        return {**data, **static}, metadata

    # -- live (LiveView) ---------------------------------------------------------------

    def _headline(self) -> str:
        return ts.headline(self.snapshot, self.place)

    def _show(self, text: str, following: bool) -> None:
        with self._sync_lock():
            self.follow = following
            self.status = text

    def _status_line(self) -> str:
        """While live, how; otherwise nothing (the drawing's own first line says what it shows)."""
        if self.live:
            return f"live, every {self.interval:g} s" + (f", the last {self._last:g} s" if self._last else "")
        return ""
