"""Live widgets: refreshing from a background thread, even while a cell runs.

The main use of a live view is watching a long cell (training) work; a timer on the
kernel's event loop would freeze for exactly that long. So each live widget has a
daemon thread (``Refresher``) that takes the snapshot (RPC calls, tens of ms) and
sets the widget's traits itself. ipykernel 7 sends IOPub messages from any thread
through its IOPub thread, and a test in a real kernel and browser shows updates
arriving during a busy cell.

STYLE.md says only the kernel thread sets widget traits. This module is the one
exception, made safe by ``SyncLock``: the widget's ``set_state`` (front-end updates,
on the kernel thread) and the refresher's trait updates take the same lock, so the
two threads never interleave inside ipywidgets' sync bookkeeping.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Callable

from ..cluster import Cluster, current

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
