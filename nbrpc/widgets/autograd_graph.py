"""``AutogradGraph``: one distributed autograd context across workers, as a layered DAG."""

from __future__ import annotations

from ..diagnostics import autograd
from ..drawing import describe, svg
from .base import GraphWidget, StaticView


class AutogradGraph(GraphWidget):
    """The backward graph of a distributed autograd context, one lane per worker.

    The loss is on top and the backward pass reads downwards; ``rpc`` edges (a
    ``RecvRpcBackward`` to the ``SendRpcBackward`` of the worker that sent that
    tensor) are thick, dashed and purple; leaves show their gradient norms once
    ``dist_autograd.backward`` has run. Hover a function for its details, click to
    pin it (its id is ``selected``), filter by worker (``worker``).

    Parameters
    ----------
    context_or_snapshot
        A context id (snapshot taken now, see ``nbrpc.autograd_snapshot``), a
        snapshot dict, or None for the last context ``nbrpc.record_autograd()``
        recorded.
    """

    def __init__(self, context_or_snapshot: int | dict | None = None, **kwargs):
        snapshot = _snapshot(context_or_snapshot)  # first: a bad id opens no widget
        super().__init__(kind="autograd", **kwargs)
        self.context_id = None if isinstance(context_or_snapshot, dict) else context_or_snapshot
        self.update(snapshot)

    def update(self, snapshot: dict) -> None:
        """Show ``snapshot``; the front end swaps the drawing in place."""
        state = autograd_state(snapshot)
        with self._sync_lock(), self.hold_sync():
            self.snapshot = snapshot
            self.svg, self.details = state["svg"], state["details"]
            self.status = self.summary()

    def refresh(self) -> None:
        """Take the context's snapshot again (after ``backward``: with gradients)."""
        context_id = self.snapshot.get("context_id") if self.context_id is None else self.context_id
        self.update(autograd.autograd_snapshot(context_id))

    def summary(self) -> str:
        return describe.autograd_summary(self.snapshot)

    def to_svg(self) -> str:
        return svg.autograd_svg(self.snapshot)


def autograd_state(snapshot: dict) -> dict:
    """What ``graph.js`` reads of an autograd graph showing ``snapshot`` (the widget's synced
    traits, the side panel's docked view)."""
    return {"kind": "autograd", "svg": svg.autograd_svg(snapshot, titles=False),
            "details": describe.autograd_details(snapshot)}


def autograd_static(context_or_snapshot: int | dict | None = None) -> StaticView:
    """The autograd graph drawn once, with no widget (``%autograd_graph --static``)."""
    snapshot = _snapshot(context_or_snapshot)
    return StaticView(svg.autograd_svg(snapshot), describe.autograd_summary(snapshot))


def _snapshot(context_or_snapshot: int | dict | None) -> dict:
    """A snapshot dict as given, of a context id, or the last recorded one (None)."""
    if isinstance(context_or_snapshot, dict):
        return context_or_snapshot
    if context_or_snapshot is None:
        return autograd.last_recorded()
    return autograd.autograd_snapshot(int(context_or_snapshot))
