"""``ClusterStatus``: what ``%rpc_status`` shows, refreshing by itself."""

from __future__ import annotations

import time

import anywidget
import traitlets

from ..cluster.cluster import Cluster, current
from ..drawing.status_table import StatusTable
from ..errors import NoClusterError
from ._live import Refresher, SyncLock, cluster_running
from .base import HERE


def status_state(rows: list[dict]) -> dict:
    """What ``status.js`` reads of a status table of ``rows`` (the widget's synced trait,
    the side panel's docked view)."""
    return {"html": StatusTable(rows)._repr_html_()}


class ClusterStatus(SyncLock, anywidget.AnyWidget):
    """Every member's name, rank, host, pid, state, busy threads and owned RRefs, live.

    Parameters
    ----------
    live
        Refresh every ``interval`` seconds, also while a cell runs, until the
        cluster stops (one last refresh shows it stopped) or the widget is closed.
    interval
        Seconds between refreshes.
    cluster
        The cluster to watch (default: the running one).
    """

    _esm = HERE / "status.js"
    _css = HERE / "status.css"

    html = traitlets.Unicode("", help="the status table, as %rpc_status shows it").tag(sync=True)
    status = traitlets.Unicode("", help="live or not, and when last refreshed").tag(sync=True)
    interval = traitlets.Float(2.0, help="seconds between refreshes while live")
    _refresher: Refresher | None = None  # also for __del__ after a failed __init__

    def __init__(self, live: bool = True, *, interval: float = 2.0, cluster: Cluster | None = None,
                 **kwargs):
        cluster = cluster or current()
        if cluster is None:  # before the widget exists: nothing to close
            raise NoClusterError("no cluster is running; start one with %rpc_init -n 2")
        super().__init__(interval=interval, **kwargs)
        self._cluster = cluster
        self.update(cluster.status())
        if live and cluster_running(self._cluster) is None:
            self._refresher = Refresher(self._step, self.interval, "nbrpc-cluster-status").start()
            self._set_status(f"live, every {self.interval:g} s")

    def update(self, rows: list[dict]) -> None:
        with self._sync_lock():
            self.rows = rows
            self.html = status_state(rows)["html"]

    @property
    def live(self) -> bool:
        return self._refresher is not None and self._refresher.alive

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.stop()
            self._refresher = None
            self._set_status(f"stopped at {time.strftime('%H:%M:%S')}")

    def close(self) -> None:
        if self._refresher is not None:
            self._refresher.stop(wait=False)
            self._refresher = None
        super().close()

    def _set_status(self, text: str) -> None:
        with self._sync_lock():
            self.status = text

    def _step(self) -> bool:
        if self._cluster is not None and self._cluster.state == "stopping":
            # No calls into workers that are leaving; the refresh after shows them stopped.
            return True
        try:
            self.update(self._cluster.status())
        except Exception as e:  # the cluster stopping under us; said below
            self._set_status(f"refresh failed ({type(e).__name__}: {e})")
        if self._cluster is not None and self._cluster.state == "stopping":
            return True  # it began stopping during this refresh: wait for the end
        why_not = cluster_running(self._cluster)
        if why_not is not None:
            if self._cluster is not None and self._cluster.state == "stopped":
                # The rows above may come from calls begun before the shutdown.
                self.update(self._cluster.status())
            self._refresher = None
            self._set_status(f"not live: {why_not} ({time.strftime('%H:%M:%S')})")
            return False
        return True

    def __repr__(self) -> str:
        return repr(StatusTable(self.rows))

    def _repr_mimebundle_(self, **kwargs):
        table = StatusTable(self.rows)
        static = {"text/plain": repr(table), "text/html": table._repr_html_()}
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return static
        data, metadata = bundle
        return {**data, **static}, metadata
