"""Live widgets: refreshing from a background thread, even while a cell runs.

The main use of a live view is watching a long cell (training) work; a timer on the
kernel's event loop would freeze for exactly that long. So each live widget has a
daemon thread (``Refresher``) that takes the snapshot (RPC calls, tens of ms) and
sets the widget's traits itself. ipykernel 7 sends IOPub messages from any thread
through its IOPub thread, and a test in a real kernel and browser shows updates
arriving during a busy cell.

Only the kernel thread sets widget traits, as a rule. This module is the one
exception, made safe by ``SyncLock``: the widget's ``set_state`` (front-end updates,
on the kernel thread) and the refresher's trait updates take the same lock, so the
two threads never interleave inside ipywidgets' sync bookkeeping.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections.abc import Callable

from ..cluster.cluster import Cluster, current
from ..errors import NoClusterError

FAILURES_TOLERATED = 5  # refreshes in a row that may fail before a live view gives up

_running: weakref.WeakSet[Refresher] = weakref.WeakSet()


class Refresher:
    """Call ``step`` every ``interval`` seconds on a daemon thread until it returns False,
    ``stop`` is called, or the process exits."""

    def __init__(self, step: Callable[[], bool], interval: float, name: str):
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        self._step = step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Refresher:
        _running.add(self)
        self._thread.start()
        return self

    def stop(self, wait: bool = True) -> None:
        self._stop.set()
        if wait and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if not self._step():
                break
        _running.discard(self)


def cluster_running(cluster: Cluster | None) -> str | None:
    """None while ``cluster`` is this process's running cluster, else why it is not."""
    now = current()
    if cluster is None or now is None:
        return "no cluster is running"
    if now is not cluster:
        return "the cluster it watched was shut down"
    if cluster.state != "running":
        return f"the cluster is {cluster.state}"
    return None


class LiveView:
    """``live``, ``start``, ``stop`` and ``close`` of a widget that refreshes itself.

    The widget gives ``_cluster`` (the cluster it follows), an ``interval`` trait,
    ``refresh()`` (one refresh, called from the refresher's thread), ``_status_line()`` (its
    status while live), ``_headline()`` (what it shows, for the status once stopped)
    and ``_show(text, following)`` (sets the status line; ``following`` tells whether
    it is live).
    """

    THREAD = "nbrpc-live"
    START_HINT = "start one with %rpc_init"
    _refresher: Refresher | None = None  # also for __del__ after a failed __init__
    _failures = 0

    @property
    def live(self) -> bool:
        return self._refresher is not None and self._refresher.alive

    def start(self, interval: float | None = None) -> None:
        """Refresh every ``interval`` seconds (default: the ``interval`` trait)."""
        self.stop()
        why_not = cluster_running(self._cluster)
        if why_not:
            raise NoClusterError(f"cannot refresh live: {why_not}; {self.START_HINT}")
        if interval is not None:
            self.interval = interval
        self._refresher = Refresher(self._step, self.interval, self.THREAD).start()
        self._show(self._status_line(), True)

    def stop(self, reason: str = "stopped") -> None:
        """Stop refreshing (the view stays as it is)."""
        if self._refresher is not None:
            self._refresher.stop()
            self._refresher = None
            self._show(f"{reason} at {time.strftime('%H:%M:%S')}; {self._headline()}", False)

    def close(self) -> None:
        if self._refresher is not None:
            self._refresher.stop(wait=False)
            self._refresher = None
        super().close()

    def _step(self) -> bool:
        """One refresh, on the refresher's thread; False ends the refresher."""
        why_not = cluster_running(self._cluster)
        if why_not is None:
            try:
                self.refresh()
                self._failures = 0
                return True
            except Exception as e:  # a worker busy or gone, a cluster stopping
                self._failures += 1
                why_not = cluster_running(self._cluster)
                if why_not is None and self._failures < FAILURES_TOLERATED:
                    self._show(f"refresh failed ({type(e).__name__}: {e}); retrying", True)
                    return True
                why_not = why_not or f"{self._failures} refreshes failed in a row ({e})"
        self._refresher = None
        self._show(f"not live: {why_not} ({time.strftime('%H:%M:%S')}); {self._headline()}", False)
        return False


@atexit.register
def _stop_all() -> None:
    # Before the cluster's own atexit shutdown (registered earlier, so run later):
    # no snapshot races the workers' exit.
    for refresher in list(_running):
        refresher.stop(wait=False)


class SyncLock:
    """Mix-in: one lock around every trait change, whichever thread makes it."""

    def _sync_lock(self) -> threading.RLock:
        lock = self.__dict__.get("_nbrpc_sync_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_nbrpc_sync_lock", threading.RLock())
        return lock

    def set_state(self, sync_data):
        with self._sync_lock():
            super().set_state(sync_data)
