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
  that names a ``path`` writes the driver's cell there unless it is there already (a
  worker on another host has no copy of the driver's cell files, which the functions sent
  from those cells name as their file).
"""

from __future__ import annotations

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

    async def __call__(self, message: dict) -> dict:
        command = message.get("command")
        arguments = message.get("arguments") or {}
        if command == "dumpCell" and arguments.get("path"):
            return _dump_at(message, arguments["path"], arguments.get("code", ""))
        if command == "attach":
            hide_frames(self.kernel.debugger)
        reply = await self.plain(message)
        if command in ("initialize", "attach"):
            jupyter_compat.stop_debugging_new_processes()  # debugpy.listen patched them
        if command == "attach" and reply.get("success"):
            self.tracing.start()
        elif command == "disconnect":
            self.tracing.stop()
        return reply


def hide_frames(debugger) -> None:
    """nbrpc's and torch's RPC frames join those ``debugger`` leaves out (at its ``attach``)."""
    modules = getattr(debugger, "kernel_modules", None)
    if isinstance(modules, list):
        modules.extend(p for p in HIDDEN if p not in modules)


def _dump_at(message: dict, path: str, code: str) -> dict:
    """The driver's cell ``code`` at the driver's own ``path``, where it is not already."""
    target = Path(path)
    try:
        if not target.is_file() or target.read_text(encoding="utf-8") != code:
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            tmp.write_text(code, encoding="utf-8")
            tmp.replace(target)
    except OSError as e:
        return {"type": "response", "request_seq": message.get("seq"), "success": False,
                "command": "dumpCell", "message": f"cannot write the cell's source at {path}: {e}"}
    return {"type": "response", "request_seq": message.get("seq"), "success": True,
            "command": "dumpCell", "body": {"sourcePath": path}}


def serve(kernel) -> Tracing | None:
    """Give ``kernel``'s debugger what the cluster's debugger needs (none without debugpy)."""
    if getattr(kernel, "debugger", None) is None:
        return None
    tracing = Tracing()
    kernel.do_debug_request = Requests(kernel, tracing)
    return tracing
