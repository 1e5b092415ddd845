"""A worker kernel's side of JupyterLab's debugger across the cluster.

The driver's kernel forwards the debugger's requests to each worker kernel's own
ipykernel debugger (``kernel_ext.debugging``); this module makes a worker's debugger see
what runs there. Parts:

- ``Tracing``: while a debugger is attached, each served call's thread is made known to
  debugpy as the call begins (``calls.serving.ON_CALL``), and so is the thread of each
  Python autograd Function's backward as it begins (a distributed backward runs on
  threads of torch's C++ engine, holding the GIL afresh for each node): torch makes
  those threads in C++, so debugpy never saw them start and would never stop in them.
  With no debugger attached nothing is registered, and a call pays one check.
- ``watch_pauses``: a thread that debugpy stops is in ``recording.paused.PAUSED`` until
  it goes on, with the call it serves and where it stands, so that ``nbrpc.waits()``,
  a waiting cell and the side panel say "paused in the debugger at cell N, line M", and
  a caller whose timeout passed meanwhile waits on for the reply (as for pdb).
- ``Unhurried``: while a debugger is attached, this process's calls have no default
  timeout (torch's ``0``): a call, a ``to_here``, a backward's gradients or an optimizer
  step that waits on a person stepping through a member is no hang. A timeout given to
  the call itself stands (and a call paused past it waits on for its reply).
- ``Requests``: wraps the kernel's ``do_debug_request``. ``attach`` hides nbrpc's and
  torch's RPC frames from the debugger (they join the kernel's own modules, which
  ipykernel already hides) and starts ``Tracing``; ``disconnect`` stops it; a ``dumpCell``
  that names a ``path`` gives ``Cells`` the driver's cell to hold there (a worker on
  another host has no copy of the driver's cell files, which the functions sent from
  those cells name as their file).
- ``Cells``: the driver's cells at the driver's paths, written there, or held in memory
  where this host cannot write there (pydevd then takes breakpoints in them all the same).
"""

from __future__ import annotations

import linecache
import os
import threading
from pathlib import Path

import torch
import torch.distributed.rpc as rpc

from .._compat import debugger_compat, jupyter_compat, torch_compat
from ..calls import interrupts, serving
from ..recording.paused import PAUSED

# Frames the debugger skips on a worker, besides the kernel's own modules: nbrpc's
# machinery around a call and torch's RPC functions under it.
HIDDEN = (str(Path(__file__).resolve().parents[1] / "**"),
          str(Path(torch.__file__).resolve().parent / "distributed" / "**"))


class Tracing:
    """Each served call's thread, and each backward's, joins the attached debugger."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.on = False
        self._undo_backward = None
        self.unhurried = Unhurried()

    @staticmethod
    def _trace_this_thread() -> None:
        import debugpy

        debugpy.debug_this_thread()

    def start(self) -> None:
        with self._lock:
            self.on = True
            serving.ON_CALL.add(self._trace_this_thread)
            if self._undo_backward is None:
                self._undo_backward = debugger_compat.before_backward(self._trace_this_thread)
            watch_pauses()
            self.unhurried.start()

    def stop(self) -> None:
        with self._lock:
            self.on = False
            serving.ON_CALL.discard(self._trace_this_thread)
            if self._undo_backward is not None:
                self._undo_backward()
                self._undo_backward = None
            self.unhurried.stop()


class Unhurried:
    """No default RPC timeout in this process while a debugger is attached."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.saved: float | None = None

    def start(self) -> None:
        """Calls from now on wait with no default timeout (the agent's, if RPC is up)."""
        with self._lock:
            if not torch_compat.has_agent():
                return
            timeout = rpc.get_rpc_timeout()
            if timeout == 0:
                return
            if self.saved is None:
                self.saved = timeout
            torch_compat.set_rpc_timeout(0)

    def stop(self) -> None:
        """The default timeout as it was before ``start``."""
        with self._lock:
            saved, self.saved = self.saved, None
            if saved is not None and torch_compat.has_agent():
                torch_compat.set_rpc_timeout(saved)


def watch_pauses() -> None:
    """Threads debugpy stops here are in ``PAUSED`` while stopped (once per process)."""
    debugger_compat.on_suspend(_pausing, PAUSED.resume)


def _pausing(frame) -> None:
    served = interrupts.served_here()
    PAUSED.pause(served.call_id if served is not None else None, frame.f_code.co_filename,
                 frame.f_lineno, how="debugger")


class Requests:
    """A worker kernel's ``do_debug_request``, with what the cluster's debugger needs."""

    def __init__(self, kernel, tracing: Tracing):
        self.kernel = kernel
        self.tracing = tracing
        self.plain = kernel.do_debug_request
        self.cells = Cells()

    async def __call__(self, message: dict) -> dict:
        command = message.get("command")
        arguments = message.get("arguments") or {}
        if command == "dumpCell" and arguments.get("path"):
            return self.cells.dump(message, arguments["path"], arguments.get("code", ""))
        if command == "attach":
            hide_frames(self.kernel.debugger)
        reply = await self.plain(message)
        if command in ("initialize", "attach"):
            jupyter_compat.stop_debugging_new_processes()  # debugpy.listen patched them
        if command == "attach" and reply.get("success"):
            self.tracing.start()
        elif command == "disconnect":
            self.tracing.stop()
        elif command == "stackTrace":
            self.cells.as_files(reply)
        return reply


def hide_frames(debugger) -> None:
    """nbrpc's and torch's RPC frames join those ``debugger`` leaves out (at its ``attach``)."""
    modules = getattr(debugger, "kernel_modules", None)
    if isinstance(modules, list):
        modules.extend(p for p in HIDDEN if p not in modules)


class Cells:
    """The driver's cells this worker holds, at the driver's own paths (the functions sent
    from a cell name it as their file): on disk, or, where this host cannot write there
    (another user's folder, a read-only or missing tree: a driver on a laptop), in
    memory, in ``linecache``, where pydevd is told breakpoints may go."""

    def __init__(self) -> None:
        self.in_memory: set[str] = set()

    def dump(self, message: dict, path: str, code: str) -> dict:
        """The driver's cell ``code`` at ``path``, where it is not already."""
        target = Path(path)
        try:
            if not target.is_file() or target.read_text(encoding="utf-8") != code:
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.{os.getpid()}")
                tmp.write_text(code, encoding="utf-8")
                tmp.replace(target)
            self.in_memory.discard(path)
        except OSError:
            self._keep(path, code)
        return {"type": "response", "request_seq": message.get("seq"), "success": True,
                "command": "dumpCell", "body": {"sourcePath": path}}

    def _keep(self, path: str, code: str) -> None:
        # No mtime: linecache.checkcache keeps it (so does wire.definitions for a
        # received function's lines).
        linecache.cache[path] = (len(code), None, code.splitlines(keepends=True), path)
        self.in_memory.add(path)
        debugger_compat.accept_breakpoints_in(self.held)

    def held(self, path: str) -> bool:
        return path in self.in_memory

    def as_files(self, reply: dict) -> dict:
        """A ``stackTrace`` reply whose frames in cells held in memory name their file
        alone: pydevd offers such a frame's source by reference, which only this worker
        could answer, while the driver has the file."""
        for frame in (reply.get("body") or {}).get("stackFrames", []):
            source = frame.get("source") or {}
            if source.get("path") in self.in_memory:
                source["sourceReference"] = 0
        return reply


def serve(kernel) -> Tracing | None:
    """Give ``kernel``'s debugger what the cluster's debugger needs (none without debugpy)."""
    if getattr(kernel, "debugger", None) is None:
        return None
    tracing = Tracing()
    kernel.do_debug_request = Requests(kernel, tracing)
    return tracing
