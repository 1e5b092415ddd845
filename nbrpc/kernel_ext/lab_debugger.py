"""JupyterLab's debugger across the cluster: the driver kernel's debug adapter multiplexer.

JupyterLab's debugger talks to the notebook's kernel only: ``debug_request``s on its
control channel, ``debug_event``s on its IOPub. Every worker is an ipykernel with the
same debugger (debugpy), so the driver answers the debugger itself and passes on to each
worker's debugger what concerns it (``cluster.debugger_links``), as if the members'
threads were its own. Parts:

- ``Ids``: the ids a worker's debugger gives its threads, frames and variables, turned
  into ids of the driver's session (from ``FIRST`` up, far above the driver's own ids,
  which pass through unchanged) and back, so that a request about one goes to its member.
- ``Sources``: the cells JupyterLab dumped (``dumpCell``), by file. A function sent from
  a cell keeps its cell's file name (``wire.definitions``), so a breakpoint goes to each
  member on the driver's file, with the cell's source (a member on another host writes
  it there); a ``%%rpc_on`` cell runs as its body on the member, whose file is the
  member's own: its breakpoints go there one line up, and its frames come back one down.
- ``Session``: what JupyterLab set up (``initialize`` and ``attach`` arguments,
  breakpoints), replayed to each member as it comes, before and after every cell, so
  that a cluster started after the debugger was switched on is debugged too. While it
  is on, the driver's calls, as the members', have no default timeout (``Unhurried``).
- ``ClusterDebugger``: the kernel's ``do_debug_request``: a request about a member's
  thread, frame or variable goes to that member; ``threads`` lists the members' threads
  too, named ``worker1: <thread>``; set-up requests go everywhere; anything else is the
  driver's. Members' events come back on the driver's IOPub (``Relay``).
"""

from __future__ import annotations

import copy
import itertools
import threading
from pathlib import Path

from .._compat import jupyter_compat
from ..cluster import cluster as cluster_mod
from ..cluster.debugger_links import DebuggerLink, Helper, Relay
from ..member.lab_debugger import Unhurried, hide_frames, watch_pauses

# The first id given to a member's thread, frame or variable: the driver's own are
# small numbers (threads) or addresses (frames, variables), all below 2**48.
FIRST = 1 << 50
ID_KEYS = ("threadId", "frameId", "variablesReference", "srcFrameId")
# Lists whose items' "id" is a thread's or a frame's.
ID_LISTS = frozenset({"threads", "stackFrames"})
# Requests that set the session up: the driver's answer is the answer, and every member
# gets the same request.
EVERYWHERE = frozenset({"setBreakpoints", "setExceptionBreakpoints", "setFunctionBreakpoints"})
# Events of a member that JupyterLab hears.
RELAYED = frozenset({"stopped", "continued", "thread"})
RESUMING = frozenset({"continue", "next", "stepIn", "stepOut"})
RPC_ON = "%%rpc_on"


class Ids:
    """Members' debugger ids as ids of the driver's session, and back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: dict[tuple[str, int], int] = {}
        self._in: dict[int, tuple[str, int]] = {}
        self._next = itertools.count(FIRST)

    def outward(self, member: str, value: int) -> int:
        if not value:  # 0: "no children", the same everywhere
            return value
        with self._lock:
            found = self._out.get((member, value))
            if found is None:
                found = self._out[(member, value)] = next(self._next)
                self._in[found] = (member, value)
            return found

    def inward(self, value) -> tuple[str | None, int]:
        """``(member, its id)``, or ``(None, value)`` for the driver's own."""
        found = self._in.get(value) if isinstance(value, int) else None
        return found if found is not None else (None, value)

    def clear(self) -> None:
        with self._lock:
            self._out.clear()
            self._in.clear()


def remap(value, convert, within: str = ""):
    """``value`` with every thread, frame and variable id passed through ``convert``."""
    if isinstance(value, dict):
        return {k: (convert(v) if isinstance(v, int) and not isinstance(v, bool)
                    and (k in ID_KEYS or (k == "id" and within in ID_LISTS)) else remap(v, convert, k))
                for k, v in value.items()}
    if isinstance(value, list):
        return [remap(v, convert, within) for v in value]
    return value


def rpc_on_body(code: str) -> str | None:
    """What a ``%%rpc_on`` cell runs on its members (IPython's own split), else None."""
    if not code.startswith(RPC_ON):
        return None
    cell = code if code.endswith("\n") else code + "\n"
    return cell.split("\n", 1)[1]


class Sources:
    """Cells JupyterLab dumped, by the driver's file name; each member's ``%%rpc_on`` files."""

    def __init__(self) -> None:
        self.cells: dict[str, str] = {}
        # member -> its file of a %%rpc_on body -> the driver's file of that cell
        self.bodies: dict[str, dict[str, str]] = {}

    def code(self, path: str) -> str | None:
        if path not in self.cells:
            try:
                self.cells[path] = Path(path).read_text(encoding="utf-8")
            except OSError:
                return None
        return self.cells[path]

    def to_driver(self, member: str, reply: dict) -> dict:
        """A member's answer with its ``%%rpc_on`` files named as the driver's cells."""
        bodies = self.bodies.get(member)
        for frame in (reply.get("body") or {}).get("stackFrames", []) if bodies else []:
            cell = bodies.get((frame.get("source") or {}).get("path"))
            if cell is not None:
                frame["source"] = {**frame["source"], "path": cell}
                frame["line"] = frame.get("line", 0) + 1
        return reply


class Session:
    """What JupyterLab set up, for members that come later."""

    def __init__(self) -> None:
        self.on = False
        self.initialize: dict = {"command": "initialize", "type": "request", "arguments": {
            "clientID": "nbrpc", "adapterID": "python", "pathFormat": "path",
            "linesStartAt1": True, "columnsStartAt1": True}}
        self.attach: dict = {"command": "attach", "type": "request", "arguments": {}}
        self.setups: dict[tuple, dict] = {}  # (command, source path or "") -> the newest request

    def record(self, message: dict) -> None:
        command = message["command"]
        if command == "initialize":
            self.initialize = copy.deepcopy(message)
        elif command == "attach":
            self.attach = copy.deepcopy(message)
        elif command in EVERYWHERE:
            path = ((message.get("arguments") or {}).get("source") or {}).get("path", "")
            self.setups[(command, path)] = copy.deepcopy(message)

    def adopt(self, debugger) -> None:
        """The driver's debugger was on before nbrpc loaded: take its breakpoints."""
        self.on = bool(getattr(debugger, "is_started", False))
        for path, breakpoints in (getattr(debugger, "breakpoint_list", None) or {}).items():
            self.record({"command": "setBreakpoints", "type": "request", "seq": 0,
                         "arguments": {"source": {"path": path}, "breakpoints": breakpoints}})


class ClusterDebugger:
    """The driver kernel's ``do_debug_request``: the cluster's members as its own threads."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.plain = kernel.do_debug_request
        self.ids = Ids()
        self.sources = Sources()
        self.session = Session()
        self.session.adopt(getattr(kernel, "debugger", None))
        self.links: dict[str, DebuggerLink] = {}
        self.stopped: dict[str, set[int]] = {}
        self.relay = Relay(self._relay_event)
        self.helper = Helper()
        self.unhurried = Unhurried()  # the driver's calls: no default timeout while debugging
        self._lock = threading.RLock()
        self._seq = itertools.count(1 << 30)

    async def __call__(self, message: dict) -> dict:
        command = message.get("command")
        member, arguments = self._route(message.get("arguments") or {})
        if member is not None:
            return await self.helper.run(self._ask_member, member, {**message, "arguments": arguments})
        if command == "attach":
            hide_frames(self.kernel.debugger)
            # The workers are debugged through their own kernels: debugpy must not also
            # start them (and the warm template) under itself, as it does a child process.
            message.setdefault("arguments", {}).setdefault("subProcess", False)
        if command == "continue" and not (message.get("arguments") or {}).get("singleThread"):
            return await self._continue(message)
        reply = await self.plain(message)
        if command in ("initialize", "attach"):
            jupyter_compat.stop_debugging_new_processes()  # debugpy.listen patched them
        if command in ("initialize", "attach") or command in EVERYWHERE:
            self.session.record(message)
        if command == "dumpCell" and reply.get("success"):
            self.sources.cells[reply["body"]["sourcePath"]] = (message.get("arguments") or {}).get("code", "")
        if command == "attach" and reply.get("success"):
            self.session.on = True
            watch_pauses()
            await self.helper.run(self.sync)
        elif command in EVERYWHERE and self.session.on:
            await self.helper.run(self._everywhere, message)
        elif command == "threads" and reply.get("success"):
            await self.helper.run(self._with_member_threads, reply)
        elif command == "debugInfo" and reply.get("body") is not None:
            reply["body"]["stoppedThreads"] = list(reply["body"].get("stoppedThreads", [])) + [
                t for threads in list(self.stopped.values()) for t in threads]
        elif command == "disconnect":
            await self.helper.run(self.end)
        return reply

    def _route(self, arguments: dict) -> tuple[str | None, dict]:
        """The member a request is about (None: the driver), with its ids turned back."""
        for key in ID_KEYS:
            member, _ = self.ids.inward(arguments.get(key))
            if member is not None:
                return member, remap(arguments, lambda v: self.ids.inward(v)[1], "arguments")
        return None, arguments

    # -- members -------------------------------------------------------------------

    def _ask(self, link: DebuggerLink, message: dict) -> dict:
        return link.request({"type": "request", "seq": next(self._seq), **message})

    def _ask_member(self, member: str, message: dict) -> dict:
        link = self.links.get(member)
        if link is None:
            return _failure(message, f"{member} has left the cluster")
        try:
            reply = link.request(message)
        except (TimeoutError, RuntimeError) as e:
            return _failure(message, str(e))
        reply = self.sources.to_driver(member, remap(reply, lambda v: self.ids.outward(member, v)))
        if message["command"] in RESUMING and reply.get("success"):
            self._forget_stopped(member, message["arguments"].get("threadId"), reply)
        return reply

    async def _continue(self, message: dict) -> dict:
        """DAP's continue resumes every thread, the members' too. JupyterLab's names thread 1
        once it forgot the stopped one, and pydevd never answers a continue while none of its
        threads is stopped: then the members' resuming is the answer."""
        await self.helper.run(self._continue_members)
        if getattr(self.kernel.debugger, "stopped_threads", True):
            return await self.plain(message)
        return {"type": "response", "request_seq": message.get("seq"), "success": True,
                "command": "continue", "body": {"allThreadsContinued": True}}

    def _continue_members(self) -> None:
        for member, threads in list(self.stopped.items()):
            if threads:
                thread = self.ids.inward(next(iter(threads)))[1]
                self._ask_member(member, {"type": "request", "seq": next(self._seq), "command": "continue",
                                          "arguments": {"threadId": thread}})

    def _with_member_threads(self, reply: dict) -> None:
        threads = reply.setdefault("body", {}).setdefault("threads", [])
        for name, link in list(self.links.items()):
            try:
                theirs = self._ask(link, {"command": "threads"})
            except (TimeoutError, RuntimeError):
                continue
            for thread in (theirs.get("body") or {}).get("threads", []):
                threads.append({"id": self.ids.outward(name, thread["id"]), "name": f"{name}: {thread['name']}"})

    def sync(self) -> None:
        """Members that joined since get the session; members that left are forgotten."""
        if not self.session.on:
            return
        cluster = cluster_mod.current()
        workers = ([w for w in cluster.workers if w.state == "running" and w.client is not None]
                   if cluster is not None and cluster.state == "running" else [])
        with self._lock:
            if workers:
                self.unhurried.start()
            else:
                self.unhurried.stop()
            for name in set(self.links) - {w.name for w in workers}:
                self._drop(name)
            for worker in workers:
                if worker.name not in self.links:
                    self._join(worker)

    def _join(self, worker) -> None:
        link = DebuggerLink(worker)
        self.relay.watch(link)
        try:
            self._ask(link, copy.deepcopy(self.session.initialize))
            attached = self._ask(link, copy.deepcopy(self.session.attach))
            if not attached.get("success"):
                raise RuntimeError(attached.get("message") or "attach failed")
            self.links[worker.name] = link
            for setup in list(self.session.setups.values()):
                self._set_up(worker.name, link, setup)
            self._ask(link, {"command": "configurationDone"})
        except (TimeoutError, RuntimeError) as e:
            self.kernel.log.warning("nbrpc: %s is not debugged: %s", worker.name, e)
            self.links.pop(worker.name, None)
            self.relay.forget(worker.name)
            link.close()

    def _set_up(self, member: str, link: DebuggerLink, message: dict) -> None:
        """One set-up request on one member: a cell's breakpoints on its file there."""
        message = copy.deepcopy(message)
        source = (message.get("arguments") or {}).get("source") or {}
        path = source.get("path")
        code = self.sources.code(path) if path else None
        if code is not None and message["command"] == "setBreakpoints":
            body = rpc_on_body(code)
            if body is None:
                self._ask(link, {"command": "dumpCell", "arguments": {"code": code, "path": path}})
            else:
                dumped = self._ask(link, {"command": "dumpCell", "arguments": {"code": body}})
                there = (dumped.get("body") or {}).get("sourcePath")
                if not there:
                    return
                self.sources.bodies.setdefault(member, {})[there] = path
                source["path"] = there
                message["arguments"]["breakpoints"] = [
                    {**b, "line": b["line"] - 1} for b in message["arguments"].get("breakpoints", [])
                    if b.get("line", 0) > 1]
        self._ask(link, message)

    def _everywhere(self, message: dict) -> None:
        with self._lock:
            for name, link in list(self.links.items()):
                try:
                    self._set_up(name, link, message)
                except (TimeoutError, RuntimeError) as e:
                    self.kernel.log.warning("nbrpc: %s's debugger: %s", name, e)

    def _drop(self, name: str) -> None:
        link = self.links.pop(name, None)
        self.stopped.pop(name, None)
        self.sources.bodies.pop(name, None)
        self.relay.forget(name)
        if link is not None:
            link.close()

    def end(self) -> None:
        """The debugger disconnected: every member's debugger too."""
        with self._lock:
            self.session.on = False
            self.unhurried.stop()
            for name, link in list(self.links.items()):
                try:
                    self._ask(link, {"command": "disconnect",
                                     "arguments": {"restart": False, "terminateDebuggee": False}})
                except (TimeoutError, RuntimeError):
                    pass
                self._drop(name)
            self.relay.stop()
            self.ids.clear()
            self.session.setups.clear()

    # -- events --------------------------------------------------------------------

    def _relay_event(self, member: str, event: dict) -> None:
        if event.get("event") not in RELAYED:
            return
        event = remap(event, lambda v: self.ids.outward(member, v))
        body = event.get("body") or {}
        if event["event"] == "stopped" and "threadId" in body:
            self.stopped.setdefault(member, set()).add(body["threadId"])
        elif event["event"] == "continued":
            self._forget_stopped(member, body.get("threadId"), {"body": body})
        jupyter_compat.publish_debug_event(self.kernel, event)

    def _forget_stopped(self, member: str, thread: int | None, reply: dict) -> None:
        stopped = self.stopped.get(member, set())
        if (reply.get("body") or {}).get("allThreadsContinued", True) or thread is None:
            stopped.clear()
        else:
            stopped.discard(thread)

    # -- the shell -----------------------------------------------------------------

    def around_cell(self, *_) -> None:
        """Before and after every cell (``%rpc_init`` among them): members have the session."""
        if self.session.on:
            try:
                self.sync()
            except Exception as e:  # the cell runs anyway; debugging members is a bonus
                self.kernel.log.warning("nbrpc: the cluster's debugger: %s", e)


def _failure(message: dict, text: str) -> dict:
    return {"type": "response", "request_seq": message.get("seq"), "success": False,
            "command": message.get("command"), "message": text, "body": {}}


class LabDebugger:
    """The cluster's debugger in one driver kernel's shell (none outside a kernel)."""

    def __init__(self) -> None:
        self.debugger: ClusterDebugger | None = None

    def register(self, shell) -> None:
        kernel = getattr(shell, "kernel", None)
        if kernel is None or getattr(kernel, "debugger", None) is None:
            return  # a terminal IPython, or no debugpy: no debugger to extend
        self.debugger = ClusterDebugger(kernel)
        kernel.do_debug_request = self.debugger
        jupyter_compat.stop_debugging_new_processes()  # if the debugger started before nbrpc loaded
        shell.events.register("pre_run_cell", self.debugger.around_cell)
        shell.events.register("post_run_cell", self.debugger.around_cell)

    def unregister(self, shell) -> None:
        if self.debugger is None:
            return
        shell.events.unregister("pre_run_cell", self.debugger.around_cell)
        shell.events.unregister("post_run_cell", self.debugger.around_cell)
        shell.kernel.do_debug_request = self.debugger.plain
        self.debugger.end()
        self.debugger = None
