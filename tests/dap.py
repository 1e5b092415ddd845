"""JupyterLab's side of the debug adapter protocol, for tests that drive a kernel's debugger.

``Dap`` sends ``debug_request``s on a kernel client's control channel and reads
``debug_event``s (and the cells' other messages) on its IOPub, as JupyterLab does;
``stops_at`` checks where a member stopped, ``cell_value`` what a cell returned.
"""

from __future__ import annotations

import re
import time


class Dap:
    """JupyterLab's side of the debug adapter protocol over one kernel client."""

    def __init__(self, client):
        self.client = client
        self.seq = 0
        self.events: list[dict] = []
        self.outputs: dict[str, list[dict]] = {}

    def request(self, command: str, timeout: float = 90, **arguments) -> dict:
        self.seq += 1
        msg = self.client.session.msg("debug_request", {"type": "request", "seq": self.seq, "command": command,
                                                         "arguments": arguments})
        self.client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            reply = self.client.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def _pump(self, deadline: float) -> None:
        msg = self.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["msg_type"] == "debug_event":
            self.events.append(msg["content"])
        else:
            self.outputs.setdefault(msg["parent_header"].get("msg_id"), []).append(msg)

    def event(self, kind: str, timeout: float = 60) -> dict:
        """The first ``kind`` event not taken yet."""
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("event") == kind:
                    return self.events.pop(i)
            assert time.monotonic() < deadline, f"no {kind!r} event within {timeout} s: {self.events}"
            self._pump(deadline)

    def idle(self, msg_id: str, timeout: float = 60) -> list[dict]:
        """The cell's IOPub messages once it has ended."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.outputs.get(msg_id, [])
            if any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for m in got):
                return got
            assert time.monotonic() < deadline, f"the cell did not end within {timeout} s"
            self._pump(deadline)

    def shown(self, msg_id: str, pattern: str, timeout: float = 60) -> str:
        """The first text a running cell displayed (or updated) that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            for m in self.outputs.get(msg_id, []):
                text = (m["content"].get("data") or {}).get("text/plain") or m["content"].get("text", "")
                if re.search(pattern, text):
                    return text
            assert time.monotonic() < deadline, f"no {pattern!r} in the cell within {timeout} s"
            self._pump(deadline)

    def panel(self, what: str = "summary") -> dict:
        """The side panel's question, on the control channel as the Jupyter server asks it."""
        msg = self.client.session.msg("nbrpc_panel_request", {"what": what})
        self.client.control_channel.send(msg)
        while True:
            reply = self.client.control_channel.get_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def top_frame(self, thread: int) -> dict:
        reply = self.request("stackTrace", threadId=thread)
        assert reply["success"], reply
        return reply["body"]["stackFrames"][0]

    def locals_of(self, frame: dict) -> dict[str, str]:
        scopes = self.request("scopes", frameId=frame["id"])
        assert scopes["success"], scopes
        reference = scopes["body"]["scopes"][0]["variablesReference"]
        found = self.request("variables", variablesReference=reference)
        assert found["success"], found
        return {v["name"]: v["value"] for v in found["body"]["variables"]}


def cell_value(messages: list[dict]) -> str:
    """The text of the value a cell's IOPub ``messages`` show as its result."""
    return "".join(m["content"]["data"].get("text/plain", "") for m in messages
                   if m["msg_type"] == "execute_result")


def stops_at(dap, member: str, source: str, line: int, timeout: float = 60) -> tuple[int, dict, dict]:
    """The member stopped at ``source``:``line``: its thread, top frame and locals."""
    thread = dap.event("stopped", timeout)["body"]["threadId"]
    names = {t["id"]: t["name"] for t in dap.request("threads")["body"]["threads"]}
    assert names[thread].startswith(f"{member}: "), names
    frame = dap.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (source, line), frame
    return thread, frame, dap.locals_of(frame)
