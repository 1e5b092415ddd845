"""``RRefGraph``: which worker owns each RRef and who holds it, refreshing live."""

from __future__ import annotations

import traitlets

from ..cluster.cluster import current
from ..diagnostics import rrefs
from ..drawing import describe, svg
from ..errors import NoClusterError
from .base import LiveGraph, StaticView


class RRefGraph(LiveGraph):
    """The RRef ownership graph: one lane per worker, RRefs coloured by owner.

    Edges go from each RRef to the workers holding a user reference to it; fork
    history (the "fork history" toggle, ``show_forks``) draws the sends between
    workers. Hover an RRef for its id, type, summary, size, holders and call site;
    click to pin it (its id is ``selected``); filter by worker (``worker``).

    Parameters
    ----------
    live
        Refresh by itself every ``interval`` seconds, also while a cell runs, until
        the cluster stops or the widget is closed.
    interval
        Seconds between refreshes.
    snapshot
        Show this ``nbrpc.rref_snapshot()``-shaped dict instead of asking the
        cluster (never live).
    aggregate_above
        Static views (``to_svg``, saved notebooks) of more RRefs than this show one
        node per owner with counts; the widget shows every RRef, and one edge per
        (owner, holder) pair, with an RRef's own edges lit on hover and pin.
    """

    interval = traitlets.Float(1.0, help="seconds between refreshes while live")
    aggregate_above = traitlets.Int(
        200, help="static views of more RRefs than this show per-owner counts")
    THREAD = "nbrpc-rref-graph"

    def __init__(self, live: bool = True, *, interval: float = 1.0, snapshot: dict | None = None,
                 aggregate_above: int = 200, **kwargs):
        cluster = None
        if snapshot is None:  # first: with no cluster, no widget is opened
            cluster = current()
            if cluster is None:
                raise NoClusterError(
                    "no cluster is running, so there are no RRefs to show; start one with "
                    "%rpc_init (or nbrpc.start()), or pass snapshot=... to draw a saved snapshot")
            snapshot = rrefs.rref_snapshot()
        super().__init__(kind="rref", interval=interval, aggregate_above=aggregate_above, **kwargs)
        self._cluster = cluster
        self.update(snapshot)
        if live and cluster is not None:
            self.start()

    # -- data ------------------------------------------------------------------------

    def update(self, snapshot: dict) -> None:
        """Show ``snapshot``; the front end swaps the drawing in place."""
        state = rref_state(snapshot, show_forks=self.show_forks, aggregate_above=self.aggregate_above)
        with self._sync_lock(), self.hold_sync():
            self.snapshot = snapshot
            self.svg, self.details = state["svg"], state["details"]
            self.status = self._status_line()

    @traitlets.observe("show_forks")
    def _forks_toggled(self, change) -> None:
        snapshot = getattr(self, "snapshot", None)
        if snapshot is not None:
            self.update(snapshot)

    def refresh(self) -> None:
        """Take a new snapshot now."""
        self.update(rrefs.rref_snapshot())

    def summary(self) -> str:
        return describe.rref_summary(self.snapshot)

    def to_svg(self) -> str:
        return svg.rref_svg(self.snapshot, show_forks=self.show_forks, worker=self.worker or None,
                            aggregate_above=self.aggregate_above)


def rref_state(snapshot: dict, *, show_forks: bool = False, aggregate_above: int = 200) -> dict:
    """What ``graph.js`` reads of an RRef graph showing ``snapshot``: the widget's synced
    traits, and what the side panel's docked view is fed."""
    # Fork arcs get their band over the lanes only while shown: no empty space above.
    drawing = svg.rref_svg(snapshot, show_forks=show_forks, bundle_above=aggregate_above, titles=False)
    return {"kind": "rref", "svg": drawing, "details": describe.rref_details(snapshot)}


def rref_static(snapshot: dict | None = None, aggregate_above: int = 200) -> StaticView:
    """The RRef graph drawn once, with no widget (``%rref_graph --static``)."""
    snapshot = rrefs.rref_snapshot() if snapshot is None else snapshot
    return StaticView(svg.rref_svg(snapshot, aggregate_above=aggregate_above),
                      describe.rref_summary(snapshot))
