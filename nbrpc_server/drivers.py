"""The Jupyter server's side of the side panel: asking driver kernels over their channels.

Parts:

- ``beacon(kernel)``: the file a driver kernel writes beside its connection file while a
  cluster runs (``kernel_ext.panel.Beacon``); no file, no question, so a server whose
  kernels run no cluster does nothing.
- ``Channel``: one kernel's control (or shell) channel as its kernel manager connects it
  (``connect_control()``, CurveZMQ keys included), signed by its session; replies are
  matched to questions by their parent's ``msg_id``.
- ``Drivers``: the control channels of the kernels this server's kernel manager owns, by
  kernel id; ``clusters()``, ``view()``, ``shutdown()`` (control) and ``start()`` (shell).

The control channel is served by ipykernel on a thread of its own, so a kernel whose
cell waits on a hang still answers (and shuts its cluster down); the shell channel would
queue behind that cell, which is right for a start only: it runs as a cell would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from zmq.eventloop.zmqstream import ZMQStream

from .protocol import REQUEST, beacon_path, start_code

# Seconds to wait for a summary (the driver's probe of its workers takes up to 0.8 s), a view,
# a shutdown (a graceful leave, else the workers are stopped) and a start (behind running cells).
SUMMARY_TIMEOUT = 2.5
VIEW_TIMEOUT = 15.0
SHUTDOWN_TIMEOUT = 60.0
START_TIMEOUT = 600.0


def beacon(kernel) -> Path | None:
    """The kernel's beacon file, if its driver runs a cluster now."""
    connection_file = getattr(kernel, "connection_file", "")
    if not connection_file:
        return None
    path = beacon_path(connection_file)
    return path if path.exists() else None


class Channel:
    """One kernel's control or shell channel, with the questions awaiting a reply."""

    def __init__(self, kernel, name: str = "control"):
        socket = getattr(kernel, f"connect_{name}")()
        # jupyter_server's kernel managers hand out ZMQStreams on its loop; a plain socket is wrapped.
        self.stream = socket if isinstance(socket, ZMQStream) else ZMQStream(socket)
        self.session = kernel.session
        self.waiting: dict[str, asyncio.Future] = {}
        self.stream.on_recv(self._received)

    def _received(self, parts: list) -> None:
        _, parts = self.session.feed_identities(parts)
        reply = self.session.deserialize(parts)
        future = self.waiting.pop(reply["parent_header"].get("msg_id"), None)
        if future is not None and not future.done():
            future.set_result(reply["content"])

    async def ask(self, msg_type: str, content: dict, timeout: float) -> dict:
        """The reply's content; ``TimeoutError`` when none comes within ``timeout`` s."""
        msg = self.session.msg(msg_type, content)
        msg_id = msg["header"]["msg_id"]
        self.waiting[msg_id] = asyncio.get_running_loop().create_future()
        self.session.send(self.stream, msg)
        try:
            return await asyncio.wait_for(self.waiting[msg_id], timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"the kernel did not answer within {timeout:g} s") from None
        finally:
            self.waiting.pop(msg_id, None)

    def close(self) -> None:
        for future in self.waiting.values():
            future.cancel()
        self.stream.close(linger=0)


class Drivers:
    """The control channels of this server's kernels that run a cluster."""

    def __init__(self, kernel_manager, session_manager):
        self.kernel_manager, self.session_manager = kernel_manager, session_manager
        self.channels: dict[str, Channel] = {}

    def owned(self, kernel_id: str):
        """This server's kernel ``kernel_id``, or None (never another server's kernel)."""
        if kernel_id not in self.kernel_manager:
            return None
        return self.kernel_manager.get_kernel(kernel_id)

    def _channel(self, kernel_id: str, kernel) -> Channel:
        channel = self.channels.get(kernel_id)
        if channel is None:
            channel = self.channels[kernel_id] = Channel(kernel)
        return channel

    def _forget_ended(self) -> None:
        for kernel_id in [k for k in self.channels if k not in self.kernel_manager]:
            self.channels.pop(kernel_id).close()

    async def ask(self, kernel_id: str, content: dict, timeout: float) -> dict | None:
        """The driver's answer, or None when that kernel is not this server's or runs no cluster."""
        kernel = self.owned(kernel_id)
        if kernel is None or beacon(kernel) is None:
            return None
        try:
            return await self._channel(kernel_id, kernel).ask(REQUEST, content, timeout)
        except TimeoutError as e:
            return {"error": f"{e}; it may be busy with a thread that holds the GIL, or stopped"}

    async def clusters(self, members: bool = True) -> list[dict]:
        """Every cluster of this server's kernels, with the notebook (or console) it belongs to;
        without ``members``, each driver answers from what it knows, asking no worker at rest."""
        self._forget_ended()
        ids = [k for k in self.kernel_manager.list_kernel_ids() if beacon(self.kernel_manager.get_kernel(k))]
        if not ids:
            return []
        paths = {s["kernel"]["id"]: s for s in await self.session_manager.list_sessions() if s.get("kernel")}
        question = {"what": "summary", "members": members}
        answers = await asyncio.gather(*(self.ask(k, question, SUMMARY_TIMEOUT) for k in ids))
        out = []
        for kernel_id, answer in zip(ids, answers):
            if not answer or answer.get("cluster") is None and "error" not in answer:
                continue
            session = paths.get(kernel_id, {})
            out.append({"kernel_id": kernel_id, "path": session.get("path"), "type": session.get("type"),
                        "name": session.get("name"), **answer})
        return out

    async def view(self, kernel_id: str, name: str, front_end: bool = False,
                   options: dict | None = None) -> dict | None:
        """One view's state (and, with ``front_end``, its widget's ES module and CSS)."""
        question = {"what": "view", "view": name, "front_end": front_end, "options": options or {}}
        return await self.ask(kernel_id, question, VIEW_TIMEOUT)

    async def shutdown(self, kernel_id: str) -> dict | None:
        """``%rpc_shutdown``, run on the control channel: it works while a cell is stuck."""
        return await self.ask(kernel_id, {"what": "shutdown"}, SHUTDOWN_TIMEOUT)

    async def start(self, kernel_id: str, line: str) -> dict:
        """Run the form's ``%rpc_init`` line in the kernel as a cell (``ValueError`` for any
        other line): ``{"ran", "status"}``, and ``"error"`` (one line) when it failed."""
        code = start_code(line)
        channel = Channel(self.owned(kernel_id), "shell")
        try:
            reply = await channel.ask("execute_request", {
                "code": code, "silent": False, "store_history": True, "user_expressions": {},
                "allow_stdin": False, "stop_on_error": False}, START_TIMEOUT)
        finally:
            channel.close()
        out = {"ran": code, "status": reply.get("status")}
        if reply.get("status") == "error":
            out["error"] = f"{reply.get('ename')}: {reply.get('evalue')}"
        return out

    def close(self) -> None:
        """Close every channel (at the server's shutdown)."""
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()
