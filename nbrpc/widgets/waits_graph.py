"""``WaitsGraph``: the cluster's pending calls as a wait-for graph, refreshing live."""

from __future__ import annotations

import traitlets

from ..cluster import queries
from ..cluster.cluster import current
from ..drawing import waits_svg
from ..errors import NoClusterError
from .base import LiveGraph, StaticView


class WaitsGraph(LiveGraph):
    """What every member waits on: a lane per member, an arrow per pending call, the
    hangs found in red.

    An arrow goes from the caller's lane to the callee's (a loop for a call back into
    the same member), labelled with the function and its state (dashed while queued
    behind busy RPC threads); a dotted link goes from a call a member serves to the
    calls it made while serving it. The calls a finding names and the findings' own
    text are red; a member that is gone or frozen has a red lane. Hover a call for its
    call site, thread and where it is blocked; filter by member (``worker``).

    Parameters
    ----------
    live
        Refresh by itself every ``interval`` seconds, also while a cell waits on the
        cluster, until the cluster stops or the widget is closed. The snapshot is
        taken over each worker's control channel, so it comes also while every RPC
        thread is stuck.
    interval
        Seconds between refreshes.
    snapshot
        Show this ``nbrpc.waits()``-shaped dict instead of asking the cluster (never live).
    """

    interval = traitlets.Float(1.0, help="seconds between refreshes while live")
    THREAD = "nbrpc-waits-graph"

    def __init__(self, live: bool = True, *, interval: float = 1.0, snapshot: dict | None = None, **kwargs):
        cluster = None
        if snapshot is None:  # first: with no cluster, no widget is opened
            cluster = current()
            if cluster is None:
                raise NoClusterError(
                    "no cluster is running, so no call is pending; start one with %rpc_init "
                    "(or nbrpc.start()), or pass snapshot=... to draw a saved nbrpc.waits()")
            snapshot = queries.waits(cluster)
        super().__init__(kind="waits", interval=interval, **kwargs)
        self._cluster = cluster
        self.update(snapshot)
        if live and cluster is not None:
            self.start()

    def update(self, snapshot: dict) -> None:
        """Show ``snapshot``; the front end swaps the drawing in place."""
        state = waits_state(snapshot)
        with self._sync_lock(), self.hold_sync():
            self.snapshot = snapshot
            self.svg, self.details = state["svg"], state["details"]
            self.status = self._status_line()

    def refresh(self) -> None:
        """Take a new snapshot now."""
        self.update(queries.waits(self._cluster))

    def summary(self) -> str:
        return waits_svg.waits_summary(self.snapshot)

    def to_svg(self) -> str:
        return waits_svg.waits_svg(self.snapshot)

    def static(self) -> StaticView:
        return WaitsStatic(self.snapshot)


def waits_state(snapshot: dict) -> dict:
    """What ``graph.js`` reads of a wait-for graph showing ``snapshot`` (the widget's synced
    traits, the side panel's docked view)."""
    return {"kind": "waits", "svg": waits_svg.waits_svg(snapshot, titles=False),
            "details": waits_svg.waits_details(snapshot)}


class WaitsStatic(StaticView):
    """The wait-for graph drawn once, with no widget (``%rpc_waits --graph --static``)."""

    def __init__(self, snapshot: dict):
        super().__init__(waits_svg.waits_svg(snapshot), waits_svg.waits_summary(snapshot))
        self.snapshot = snapshot

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": self.summary, "text/html": waits_svg.static_html(self.snapshot)}


def waits_static(snapshot: dict | None = None) -> WaitsStatic:
    """The wait-for graph of the running cluster (or of ``snapshot``), drawn once."""
    return WaitsStatic(queries.waits(current()) if snapshot is None else snapshot)
