"""A worker kernel's side of JupyterLab's debugger across the cluster.

The driver's kernel forwards the debugger's requests to each worker kernel's own
ipykernel debugger (``kernel_ext.debugging``); this module makes a worker's debugger see
what runs there. Parts:

- ``Tracing``: while a debugger is attached, each served call's thread is made known to
  debugpy as the call begins (``calls.serving.ON_CALL``): torch's RPC threads are made by
  C++, so debugpy never saw them start and would never stop in them. With no debugger
  attached nothing is registered, and a call pays one check.
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

from .._compat import jupyter_compat
from ..calls import serving

# Frames the debugger skips on a worker, besides the kernel's own modules: nbrpc's
# machinery around a call and torch's RPC functions under it.
HIDDEN = (str(Path(__file__).resolve().parents[1] / "**"),
          str(Path(torch.__file__).resolve().parent / "distributed" / "**"))


class Tracing:
    """Each served call's thread joins the attached debugger as the call begins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.on = False

    @staticmethod
    def _trace_this_thread() -> None:
        import debugpy

        debugpy.debug_this_thread()

    def start(self) -> None:
        with self._lock:
            self.on = True
            serving.ON_CALL.add(self._trace_this_thread)

    def stop(self) -> None:
        with self._lock:
            self.on = False
            serving.ON_CALL.discard(self._trace_this_thread)


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
