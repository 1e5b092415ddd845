"""The driver's client of its workers' control channels, a side channel that needs no RPC thread.

Each worker kernel answers ``nbrpc_probe_request`` on its control channel, which ipykernel
serves on a thread of its own (``member.control.serve``), so it answers while every RPC
thread and the kernel's main thread are blocked. ``Probes`` is the driver's side, one per
cluster: a control-channel socket per worker, requests sent to all at once and answers
gathered for at most ``PROBE_TIMEOUT``. A worker that does not answer is ``gone`` (its
process ended) or ``frozen`` (stopped by a signal, or a thread holds the GIL), and is never
waited on longer.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import zmq
from jupyter_client.session import Session

if TYPE_CHECKING:
    from ..launchers.base import Worker

REQUEST = "nbrpc_probe_request"
REPLY = "nbrpc_probe_reply"
# Seconds the driver waits for every member's answer: within 1 s in all.
PROBE_TIMEOUT = 0.8


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
