"""What JupyterLab's nbrpc side panel asks a driver kernel, answered on its control channel.

Parts:

- ``Beacon``: while a cluster runs, a small file next to the kernel's connection file
  (``nbrpc-kernel-<id>.json`` beside ``kernel-<id>.json``), so that the Jupyter server
  asks only kernels that have a cluster; removed when the cluster ends and at exit.
- ``Answers``: the answers themselves. ``summary()``: the cluster's members (the rows of
  ``%rpc_status``), its pending calls and the findings of ``nbrpc.waits()`` while a call
  has waited ``hangs.AFTER`` s; ``view(name)``: one view as the state its widget's traits
  would hold, and that widget's front end on request (``panel_views``). Both run in any
  thread and never over RPC while this kernel has a call in flight, so a stuck cell does
  not hold them up.
- ``serve(kernel, answers, beacon)``: a handler for ``nbrpc_panel_request`` on the kernel's
  control channel, which ipykernel serves on a thread of its own: it answers while the
  kernel's main thread is busy (a cell waiting on a hang), as workers answer probes, and
  shuts the cluster down there too (``%rpc_shutdown``).

The protocol's names (request type, beacon prefix, views, member columns) come from
``nbrpc_server.protocol``, which the Jupyter server imports too.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time

from nbrpc_server.protocol import MEMBER_COLUMNS, REPLY, REQUEST, VIEWS, beacon_path

from ..cluster import cluster as cluster_mod
from ..cluster import queries
from ..diagnostics import autograd
from ..errors import AutogradContextError
from ..recording.pending import PENDING
from . import hangs, panel_views

# Seconds a status row (asked over RPC) serves before it is asked again.
ROWS_FRESH = 1.0
# Views drawn from every member's answer over RPC: while a call of this kernel waits, their
# RPCs could queue behind the stuck ones, so they keep their last drawing until it ends.
OVER_RPC = ("rref", "timeline")


class Beacon:
    """``nbrpc-kernel-<id>.json`` next to the connection file while a cluster runs."""

    def __init__(self, connection_file: str | None):
        self.path = beacon_path(connection_file) if connection_file else None
        atexit.register(self.clear)

    def update(self, *_) -> None:
        """Write or remove the file as a cluster runs or not (after every cell)."""
        cluster = cluster_mod.current()
        if self.path is None:
            return
        if cluster is not None and cluster.state == "running":
            if not self.path.exists():
                text = json.dumps({"pid": os.getpid(), "driver": cluster.driver_name, "since": time.time()})
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(self.path)
        else:
            self.clear()

    def clear(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class Answers:
    """The panel's questions to this driver: a summary and the views, as plain data."""

    def __init__(self) -> None:
        self._rows: list[dict] = []
        self._rows_at = 0.0
        self._rows_of: int | None = None
        self._lock = threading.Lock()

    def summary(self, members: bool = True) -> dict:
        """The running cluster in a few lines of JSON, or ``{"cluster": None}``; without
        ``members``, the members' rows asked last (no RPC), for a panel that is hidden."""
        cluster = cluster_mod.current()
        if cluster is None or cluster.state != "running":
            return {"cluster": None}
        oldest = PENDING.oldest()
        waiting = oldest is not None
        rows = self._member_rows(cluster, asked=members and not waiting)
        findings, calls = [], []
        long_wait = waiting and time.time() - oldest >= hangs.AFTER
        # While calls are in flight the busy threads come from a probe (no RPC): each
        # second while the panel shows them, else only once a call has waited AFTER s.
        if long_wait or (waiting and members):
            snap = queries.waits(cluster)
            calls = snap["calls"]
            findings = snap["findings"] if long_wait else []
            rows = _with_probe(rows, snap["members"])
        return {"cluster": {"driver": cluster.driver_name, "state": cluster.state, "trace": bool(cluster.trace),
                            "members": rows, "waiting": waiting, "calls": len(calls),
                            "findings": [{k: f[k] for k in ("kind", "members", "message")} for f in findings],
                            "autograd": _recorded()}}

    def _member_rows(self, cluster, asked: bool) -> list[dict]:
        """``cluster.status()``, asked at most every ``ROWS_FRESH`` s and never while a
        call is in flight (its RPCs would queue behind the stuck ones); else the last."""
        with self._lock:
            stale = self._rows_of != id(cluster) or time.monotonic() - self._rows_at > ROWS_FRESH
            if stale and asked:
                self._rows, self._rows_at, self._rows_of = cluster.status(), time.monotonic(), id(cluster)
            elif self._rows_of != id(cluster):
                self._rows, self._rows_of = _plain_rows(cluster), id(cluster)
            return [dict(r) for r in self._rows]

    def view(self, name: str, front_end: bool = False, options: dict | None = None) -> dict:
        """One view as ``{"summary", "state"}``, the state its widget's traits would hold
        (``{"summary", "html"}`` for the stacks); with ``front_end``, the widget's ES module
        and CSS too (``panel_views``)."""
        cluster = cluster_mod.current()
        if cluster is None or cluster.state != "running":
            return {"ended": True, "summary": "the cluster has ended"}
        if name not in VIEWS:
            raise ValueError(f"no view named {name!r}; the views are: {', '.join(VIEWS)}")
        answer = {"ended": False}
        if front_end and name in panel_views.FRONT_ENDS:
            answer["front_end"] = panel_views.front_end(name)
        oldest = PENDING.oldest()
        if name in OVER_RPC and oldest is not None and time.time() - oldest >= hangs.AFTER:
            return {**answer, "summary": "drawn before a call of this notebook began to wait; it refreshes "
                                         "once the call ends (the Wait-for graph and Stacks show the wait)"}
        drawn, summary = getattr(self, "_" + name)(cluster, options or {})
        if name == "stacks":  # text, no widget's
            return {**answer, "html": drawn, "summary": summary}
        if drawn is not None:
            # The widget's own status line says what it shows, as in a cell's output.
            answer["state"] = {**drawn, "status": summary}
        return {**answer, "summary": summary}

    # One per view (nbrpc_server.protocol.VIEWS): (the widget's state or None, a summary line).

    def _rref(self, cluster, options: dict) -> tuple[dict | None, str]:
        return panel_views.rref_view(cluster, options)

    def _timeline(self, cluster, options: dict) -> tuple[dict | None, str]:
        return panel_views.timeline_view(cluster, options)

    def _waits(self, cluster, options: dict) -> tuple[dict | None, str]:
        return panel_views.waits_view(cluster, options)

    def _autograd(self, cluster, options: dict) -> tuple[dict | None, str]:
        return panel_views.autograd_view(cluster, options)

    def _status(self, cluster, options: dict) -> tuple[dict | None, str]:
        rows = self._member_rows(cluster, asked=PENDING.oldest() is None)
        return panel_views.status_state(rows), f"{len(rows)} members"

    def _stacks(self, cluster, options: dict) -> tuple[str, str]:
        return panel_views.stacks_html(cluster)

    def shutdown(self) -> dict:
        """``%rpc_shutdown``, from the control thread: a stuck cell's calls fail as its
        workers end (what the magic would do once that cell let it run)."""
        cluster = cluster_mod.current()
        if cluster is None or cluster.state != "running":
            return {"shut_down": False, "summary": "nbrpc: no cluster is running"}
        cluster.shutdown()
        return {"shut_down": True, "summary": f"nbrpc: {cluster._summary()} shut down"}


def _recorded() -> bool:
    try:
        autograd.last_recorded()
    except AutogradContextError:
        return False
    return True


def _plain_rows(cluster) -> list[dict]:
    """Status rows with no RPC: what the driver knows of each member by itself."""
    known = [(cluster.driver_name, 0, os.uname().nodename, os.getpid(), "driver")]
    known += [(w.name, w.rank, w.host, w.pid, w.state) for w in cluster.workers]
    # devices, busy threads and owned RRefs are the members' to say: unknown here.
    return [dict(zip(MEMBER_COLUMNS, row + (None, None, None))) for row in known]


def _with_probe(rows: list[dict], members: list[dict]) -> list[dict]:
    """Rows whose busy threads and state come from a probe (no RPC needed)."""
    probed = {m["name"]: m for m in members}
    for row in rows:
        m = probed.get(row["name"])
        if m is not None:
            row["busy"] = m.get("busy", row.get("busy"))
            if m.get("state") in ("gone", "frozen"):
                row["state"] = m["state"]
            elif m.get("paused_at"):  # a person steps through it there: not a hang
                row["state"] = f"paused in the debugger at {m['paused_at']}"
    return rows


def serve(kernel, answers: Answers, beacon: Beacon) -> None:
    """Answer the side panel on this kernel's control channel."""

    def handle(stream, ident, parent) -> None:
        content = parent.get("content") or {}
        try:
            what = content.get("what")
            if what == "view":
                reply = answers.view(str(content.get("view")), bool(content.get("front_end")),
                                     dict(content.get("options") or {}))
            elif what == "shutdown":
                reply = answers.shutdown()
                beacon.update()
            else:
                reply = answers.summary(members=bool(content.get("members", True)))
        except Exception as e:  # the panel must hear back, even that it failed
            reply = {"error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, REPLY, reply, parent, ident)

    kernel.control_handlers[REQUEST] = handle


class Panel:
    """The beacon and the control-channel answers of one driver kernel's shell."""

    def __init__(self) -> None:
        self.answers = Answers()
        self.beacon: Beacon | None = None

    def register(self, shell) -> None:
        kernel = getattr(shell, "kernel", None)
        if kernel is None or not hasattr(kernel, "control_handlers"):
            return  # a terminal IPython: no Jupyter server to answer
        self.beacon = Beacon(_connection_file())
        serve(kernel, self.answers, self.beacon)
        shell.events.register("pre_run_cell", self.beacon.update)
        shell.events.register("post_run_cell", self.beacon.update)

    def unregister(self, shell) -> None:
        if self.beacon is None:
            return
        shell.events.unregister("pre_run_cell", self.beacon.update)
        shell.events.unregister("post_run_cell", self.beacon.update)
        shell.kernel.control_handlers.pop(REQUEST, None)
        self.beacon.clear()


def _connection_file() -> str | None:
    from ipykernel.kernelapp import IPKernelApp

    if not IPKernelApp.initialized():
        return None
    return IPKernelApp.instance().abs_connection_file
