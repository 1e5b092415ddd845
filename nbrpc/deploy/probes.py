"""Ask every member what it waits on, over a side channel that needs no RPC thread.

Parts:

- ``serve(app)``: in a worker, a handler for ``nbrpc_probe_request`` on its kernel's
  control channel, which ipykernel serves on a thread of its own: it answers while every
  RPC thread and the kernel's main thread are blocked. The answer is the member's
  ``diagnostics.waits.member_report`` (pending calls and every thread's stack).
- ``Probes``: the driver's side, one per cluster: a control-channel socket per worker,
  requests sent to all at once and answers gathered for at most ``PROBE_TIMEOUT``.
  A worker that does not answer is ``gone`` (its process ended) or ``frozen`` (stopped by
  a signal, or a thread holds the GIL), and is never waited on longer.
- ``waits(cluster)`` and ``stacks(cluster, members)``: ``nbrpc.waits()`` and
  ``nbrpc.stacks()``; the driver's own part is read in process.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING

import zmq
from jupyter_client.session import Session

from ..diagnostics import stacks as stacks_mod
from ..diagnostics import waits as waits_mod
from ..errors import NoClusterError, UnknownWorkerError

if TYPE_CHECKING:
    from .cluster import Cluster
    from .launchers.base import Worker

REQUEST = "nbrpc_probe_request"
REPLY = "nbrpc_probe_reply"
# Seconds the driver waits for every member's answer: within 1 s in all.
PROBE_TIMEOUT = 0.8
# Seconds a snapshot may serve to explain a call whose chain came apart since, and
# how many are kept.
RECENT = 5.0
HISTORY = 8


def serve(app, name: str) -> None:
    """Answer probes on this worker kernel's control channel."""
    kernel = app.kernel

    def handle(stream, ident, parent) -> None:
        cells = stacks_mod.Cells(getattr(getattr(kernel.shell, "compile", None), "_filename_map", {}),
                                 prefix=f"{name} ")
        try:
            content = {"report": waits_mod.member_report(name, cells)}
        except Exception as e:  # a probe must answer, even to say it failed
            content = {"error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, REPLY, content, parent, ident)

    kernel.control_handlers[REQUEST] = handle


class _Channel:
    """A DEALER socket on one worker kernel's control port, with its session's key."""

    def __init__(self, info: dict, context: zmq.Context):
        self.session = Session(key=info["key"].encode() if isinstance(info["key"], str) else info["key"],
                               signature_scheme=info.get("signature_scheme", "hmac-sha256"))
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.connect(f"{info.get('transport', 'tcp')}://{info['ip']}"
                            + (f":{info['control_port']}" if info.get("transport", "tcp") == "tcp"
                               else f"-{info['control_port']}"))

    def send(self) -> str:
        msg = self.session.send(self.socket, REQUEST, {})
        return msg["header"]["msg_id"]

    def replies(self):
        while True:
            try:
                _, msg = self.session.recv(self.socket, mode=zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg is None:
                return
            yield msg

    def close(self) -> None:
        self.socket.close(linger=0)


class Probes:
    """The driver's control-channel sockets to its workers, made on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, _Channel] = {}
        # Workers that let a probe go unanswered: asked again only once they answer it,
        # so that a frozen member costs one wait, not one per look (nor per caller queued
        # behind the lock).
        self._silent: set[str] = set()
        self._lock = threading.Lock()
        # The latest snapshots' graphs: a timeout or a death is explained by the last
        # one that saw the chain whole.
        self.history: collections.deque[waits_mod.Graph] = collections.deque(maxlen=HISTORY)

    def _channel(self, worker: Worker) -> _Channel | None:
        channel = self._channels.get(worker.name)
        if channel is None and worker.client is not None:
            info = worker.client.get_connection_info()
            channel = self._channels[worker.name] = _Channel(info, zmq.Context.instance())
        return channel

    def ask(self, workers: list[Worker], timeout: float = PROBE_TIMEOUT) -> dict[str, dict]:
        """Each worker's report, or ``{"state": gone|frozen, "why"}``; within ``timeout``."""
        with self._lock:
            out: dict[str, dict] = {}
            waiting: dict[str, tuple[Worker, _Channel, str]] = {}
            for w in workers:
                fate = w.fate()
                if fate:
                    out[w.name] = {"state": "gone", "why": fate}
                    continue
                if w.stopped():
                    out[w.name] = {"state": "frozen", "why": "stopped by a signal (SIGSTOP)"}
                    continue
                channel = self._channel(w)
                if channel is None:
                    out[w.name] = {"state": "frozen", "why": "no kernel connection"}
                    continue
                if w.name in self._silent and not any(True for _ in channel.replies()):
                    out[w.name] = {"state": "frozen", "why": _no_answer(timeout)}
                    continue
                self._silent.discard(w.name)
                waiting[w.name] = (w, channel, channel.send())
            self._gather(waiting, out, time.monotonic() + timeout)
            for name, (w, _, _) in waiting.items():
                fate = w.fate()
                if fate:
                    out[name] = {"state": "gone", "why": fate}
                elif w.stopped():
                    out[name] = {"state": "frozen", "why": "stopped by a signal (SIGSTOP)"}
                else:
                    out[name] = {"state": "frozen", "why": _no_answer(timeout)}
                    self._silent.add(name)
            return out

    @staticmethod
    def _gather(waiting: dict, out: dict, deadline: float) -> None:
        poller = zmq.Poller()
        for _, channel, _ in waiting.values():
            poller.register(channel.socket, zmq.POLLIN)
        while waiting and time.monotonic() < deadline:
            ready = dict(poller.poll(max(1, int((deadline - time.monotonic()) * 1000))))
            for name, (_, channel, msg_id) in list(waiting.items()):
                if channel.socket not in ready:
                    continue
                for reply in channel.replies():
                    if reply["parent_header"].get("msg_id") != msg_id:
                        continue  # a late answer to an earlier probe
                    content = reply["content"]
                    out[name] = ({"state": "running", "report": content["report"]} if "report" in content
                                 else {"state": "running", "error": content.get("error")})
                    del waiting[name]
                    break

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._silent.clear()


def _no_answer(timeout: float) -> str:
    return f"no answer within {timeout:g} s: a thread holds the GIL, or the process is stopped"


def _driver_cells() -> stacks_mod.Cells:
    """The driver kernel's cells (IPython's compile cache), when it runs in one."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return stacks_mod.Cells(numbers if numbers is not None else {})


def _members(cluster: Cluster, names: list[str] | None = None) -> list[dict]:
    """Every member's probe, the driver's first, as ``waits.snapshot`` takes them."""
    workers = cluster.workers
    known = [cluster.driver_name] + [w.name for w in workers]
    if names is not None:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise UnknownWorkerError(
                f"no member named {', '.join(map(repr, unknown))} in this cluster; "
                f"the members are: {', '.join(known)}")
    cells = _driver_cells()
    members = []
    if names is None or cluster.driver_name in names:
        members.append({"name": cluster.driver_name, "state": "running", "pool": cluster.threads,
                        "report": waits_mod.member_report(cluster.driver_name, cells, files=True)})
    chosen = [w for w in workers if names is None or w.name in names]
    answers = cluster.probes.ask(chosen)
    for w in chosen:
        answer = answers[w.name]
        member = {"name": w.name, "pool": cluster.threads, "pid": w.pid, **answer}
        if member.get("report"):
            stacks_mod.relabel(member["report"]["threads"], cells)
        members.append(member)
    for m in members:
        m.setdefault("pid", (m.get("report") or {}).get("pid"))
    return members


def _require(cluster: Cluster | None) -> Cluster:
    if cluster is None or cluster.state != "running":
        raise NoClusterError("no nbrpc cluster is running in this process; start one first "
                             "(%rpc_init -n 2, or nbrpc.start(n=2))")
    return cluster


def waits(cluster: Cluster | None) -> dict:
    """``nbrpc.waits()``: the cluster's pending calls as a wait-for graph with findings."""
    cluster = _require(cluster)
    graph = waits_mod.graph(_members(cluster))
    cluster.probes.history.append(graph)
    return waits_mod.snapshot_of(graph)


def explainer(cluster: Cluster):
    """What a call of this member waits on, in words (for a timeout's or an interrupt's
    error): from a fresh probe of every member, or, where the chain has just come apart
    (the callee's own call timed out a moment earlier), from the last one."""

    def explain(key: str) -> str | None:
        if cluster.state != "running":
            return None
        fresh = waits_mod.graph(_members(cluster))
        text, stuck = waits_mod.explain(fresh, key)
        callee = fresh.calls.get(key, {}).get("callee")
        if stuck and callee not in fresh.gone():
            return text
        # The chain came apart a moment ago (the callee's own call timed out), or the
        # callee is gone: what the latest snapshot with it alive says.
        for earlier in reversed(cluster.probes.history):
            if fresh.now - earlier.now > RECENT or callee in earlier.gone():
                continue
            said, was_stuck = waits_mod.explain(earlier, key)
            if said and (was_stuck or callee in fresh.gone()):
                return said
        return text

    return explain


def stacks(cluster: Cluster | None, members: list[str] | None = None) -> dict:
    """``nbrpc.stacks()``: member -> ``{"state", "pid", "threads": [{"id", "name",
    "serving", "frames"}]}``, notebook frames with their cell and line."""
    out = {}
    for m in _members(_require(cluster), members):
        entry = {"state": m["state"], "pid": m.get("pid")}
        if m.get("why"):
            entry["why"] = m["why"]
        report = m.get("report")
        if report:
            serving = {e["thread"]: e["function"] for e in report["served"]}
            entry["threads"] = [{**t, "serving": serving.get(t["id"])} for t in report["threads"]]
        out[m["name"]] = entry
    return out
