"""The driver's line to each worker kernel's own debugger.

JupyterLab's debugger speaks the debug adapter protocol to the notebook's kernel in
``debug_request`` messages on its control channel and hears ``debug_event`` messages on
its IOPub. Every worker is an ipykernel with the same debugger, so the driver reaches a
worker's debugger exactly as JupyterLab reaches the driver's: ``DebuggerLink`` holds a
control-channel socket (requests, one at a time) and an IOPub subscription (events) to
one worker kernel. ``Relay`` watches the links' IOPub sockets on a thread of its own and
hands each ``debug_event`` to a callable, with the worker's name. ``Helper`` runs the
driver's requests that wait on members on a thread of its own.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable

import zmq
from jupyter_client.session import Session

from .._compat import jupyter_compat
from ..errors import WorkerDiedError

REQUEST = "debug_request"
REPLY = "debug_reply"
EVENT = "debug_event"
# Seconds a worker's debugger may take to answer (its first ``initialize`` starts debugpy).
ANSWER_TIMEOUT = 60.0
POLL_MS = 200


def _address(info: dict, port: str) -> str:
    transport = info.get("transport", "tcp")
    separator = ":" if transport == "tcp" else "-"
    return f"{transport}://{info['ip']}{separator}{info[port]}"


class DebuggerLink:
    """A control-channel socket and an IOPub subscription to one worker kernel."""

    def __init__(self, worker, context: zmq.Context | None = None):
        info = worker.client.get_connection_info()
        key = info["key"].encode() if isinstance(info["key"], str) else info["key"]
        context = context or zmq.Context.instance()
        self.worker = worker
        self.name = worker.name
        self.session = Session(key=key, signature_scheme=info.get("signature_scheme", "hmac-sha256"))
        self.control = context.socket(zmq.DEALER)
        self.control.linger = 0
        self.control.connect(_address(info, "control_port"))
        self.iopub = context.socket(zmq.SUB)
        self.iopub.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(_address(info, "iopub_port"))
        self._lock = threading.Lock()

    def request(self, message: dict, timeout: float = ANSWER_TIMEOUT) -> dict:
        """The worker debugger's response to the DAP request ``message``."""
        with self._lock:
            sent = self.session.send(self.control, REQUEST, message)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.control.poll(int(min(left, 1.0) * 1000)):
                    fate = self.worker.fate()
                    if fate:
                        raise WorkerDiedError(f"worker {self.name!r} {fate} while its debugger was asked "
                                              f"{message.get('command')!r}")
                    if left <= 0:
                        raise TimeoutError(f"worker {self.name!r}'s debugger did not answer "
                                           f"{message.get('command')!r} within {timeout:g} s")
                    continue
                _, reply = self.session.recv(self.control, mode=zmq.NOBLOCK)
                if (reply and reply["msg_type"] == REPLY
                        and reply["parent_header"].get("msg_id") == sent["header"]["msg_id"]):
                    return reply["content"]

    def events(self) -> list[dict]:
        """The ``debug_event``s the worker published since last asked."""
        found = []
        while True:
            _, msg = self.session.recv(self.iopub, mode=zmq.NOBLOCK)  # (None, None): nothing more
            if msg is None:
                return found
            if msg["msg_type"] == EVENT:
                found.append(msg["content"])

    def close(self) -> None:
        """Close the control socket; the IOPub one is the relay's (``Relay.forget``)."""
        with self._lock:
            self.control.close(linger=0)


class Relay:
    """A thread that hands each worker's ``debug_event`` to ``on_event(name, event)``."""

    def __init__(self, on_event: Callable[[str, dict], None]):
        self.on_event = on_event
        self._links: dict[str, DebuggerLink] = {}
        self._closing: list[DebuggerLink] = []  # closed by the relay's thread, which polls them
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, link: DebuggerLink) -> None:
        with self._lock:
            self._links[link.name] = link
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="nbrpc-debug-relay", daemon=True)
                jupyter_compat.hide_from_debugger(self._thread)  # it relays while the driver is paused
                self._thread.start()

    def forget(self, name: str) -> None:
        with self._lock:
            link = self._links.pop(name, None)
            if link is not None:
                self._closing.append(link)
                if self._thread is None:
                    self._close_forgotten()

    def _close_forgotten(self) -> None:
        for link in self._closing:
            link.iopub.close(linger=0)
        self._closing.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._close_forgotten()
                links = list(self._links.values())
            poller = zmq.Poller()
            for link in links:
                poller.register(link.iopub, zmq.POLLIN)
            try:
                ready = dict(poller.poll(POLL_MS)) if links else {}
            except zmq.ZMQError:  # a link closed meanwhile
                continue
            if not links:
                self._stop.wait(POLL_MS / 1000)
            for link in links:
                if link.iopub in ready:
                    self._deliver(link)

    def _deliver(self, link: DebuggerLink) -> None:
        try:
            events = link.events()
        except zmq.ZMQError:
            return
        for event in events:
            self.on_event(link.name, event)

    def stop(self) -> None:
        """End the thread and close every IOPub socket it watched."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)
        with self._lock:
            self._thread = None
            self._closing.extend(self._links.values())
            self._links.clear()
            self._close_forgotten()


class Helper:
    """One thread, out of the debugger's sight, for the requests that wait on members: the
    control channel's loop also carries the driver's own debugger's messages, and a
    pool's threads would be paused with the rest when the driver stops at a breakpoint."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    async def run(self, function, *args):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="nbrpc-debugger", daemon=True)
                jupyter_compat.hide_from_debugger(self._thread)
                self._thread.start()
        self._jobs.put((loop, done, function, args))
        return await done

    def _serve(self) -> None:
        while True:
            loop, done, function, args = self._jobs.get()
            try:
                result, error = function(*args), None
            except BaseException as e:  # handed to the awaiting request
                result, error = None, e
            loop.call_soon_threadsafe(_settle, done, result, error)


def _settle(done: asyncio.Future, result, error) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
