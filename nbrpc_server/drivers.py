"""The Jupyter server's side of the side panel: asking driver kernels over their control channel.

Parts:

- ``beacon(kernel)``: the file a driver kernel writes beside its connection file while a
  cluster runs (``kernel_ext.panel.Beacon``); no file, no question, so a server whose
  kernels run no cluster does nothing.
- ``Channel``: an asyncio DEALER socket on one kernel's control port, signed with that
  kernel's session key; one question at a time.
- ``Drivers``: the channels of the kernels this server's kernel manager owns, by kernel id;
  ``clusters()`` (every cluster, with its notebook) and ``view(kernel_id, name)``.

The control channel is served by ipykernel on a thread of its own, so a kernel whose
cell waits on a hang still answers; the shell channel would queue behind that cell.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client.session import Session

REQUEST = "nbrpc_panel_request"  # kernel_ext.panel.REQUEST, not imported: no IPython here
BEACON_PREFIX = "nbrpc-"
# Seconds to wait for a summary (the driver's probe of its workers takes up to 0.8 s) and for a view.
SUMMARY_TIMEOUT = 2.5
VIEW_TIMEOUT = 15.0


def beacon(kernel) -> Path | None:
    """The kernel's beacon file, if its driver runs a cluster now."""
    connection_file = getattr(kernel, "connection_file", "")
    if not connection_file:
        return None
    path = Path(connection_file).with_name(BEACON_PREFIX + Path(connection_file).name)
    return path if path.exists() else None


class Channel:
    """A DEALER socket on one kernel's control port."""

    def __init__(self, kernel, context: zmq.asyncio.Context):
        info = kernel.get_connection_info(session=True)
        self.session = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        transport, ip, port = info["transport"], info["ip"], info["control_port"]
        self.socket.connect(f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}")
        self.lock = asyncio.Lock()

    async def ask(self, content: dict, timeout: float) -> dict:
        async with self.lock:
            msg = self.session.msg(REQUEST, content)
            self.session.send(self.socket, msg)
            msg_id = msg["header"]["msg_id"]
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0 or not await self.socket.poll(int(left * 1000)):
                    raise TimeoutError(f"the kernel did not answer within {timeout:g} s")
                parts = await self.socket.recv_multipart()
                _, parts = self.session.feed_identities(parts)
                reply = self.session.deserialize(parts)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"]

    def close(self) -> None:
        self.socket.close(linger=0)


class Drivers:
    """The control channels of this server's kernels that run a cluster."""

    def __init__(self, kernel_manager, session_manager):
        self.kernel_manager, self.session_manager = kernel_manager, session_manager
        self.context = zmq.asyncio.Context()
        self.channels: dict[str, Channel] = {}

    def owned(self, kernel_id: str):
        """This server's kernel ``kernel_id``, or None (never another server's kernel)."""
        if kernel_id not in self.kernel_manager:
            return None
        return self.kernel_manager.get_kernel(kernel_id)

    def _channel(self, kernel_id: str, kernel) -> Channel:
        channel = self.channels.get(kernel_id)
        if channel is None:
            channel = self.channels[kernel_id] = Channel(kernel, self.context)
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
            return await self._channel(kernel_id, kernel).ask(content, timeout)
        except TimeoutError as e:
            # A late answer must not be taken for the next question's: start afresh.
            self.channels.pop(kernel_id).close()
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

    async def view(self, kernel_id: str, name: str) -> dict | None:
        return await self.ask(kernel_id, {"what": "view", "view": name}, VIEW_TIMEOUT)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()
        self.context.term()
