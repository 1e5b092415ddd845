"""Python stacks of every thread of a member, notebook frames as cell and line.

Parts:

- ``local_threads``: this process's threads (``sys._current_frames``), each frame as
  file, line, function and source line; run in each member by its side channel
  (``cluster.control`` and ``member.control``), so it answers while every RPC thread is blocked.
- ``Cells``: file name -> cell number of a kernel's cells (IPython's compile cache, handed
  in by the kernel side), so ``label`` says "cell 3, line 6" for a cell's frame;
  notebook definitions run on workers keep the driver's file names, which the driver
  labels.
- ``fold``: nbrpc's and torch's own frames (and the interpreter's thread machinery)
  folded into one entry each run; ``blocked_at``: what a thread that serves a call
  waits on, from its innermost frames (a lock, a condition, an event, a queue, a future).
- ``format_stacks``: the text ``%rpc_stacks`` shows.
"""

from __future__ import annotations

import linecache
import os
import sys
import threading

import torch

_NBRPC = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_THREADING = os.path.abspath(threading.__file__)
_STDLIB = os.path.dirname(_THREADING) + os.sep
# (stdlib module file, function) -> what a thread waits on there.
_WAITS = {
    ("threading.py", "wait"): "condition",
    ("threading.py", "acquire"): "lock",
    ("threading.py", "join"): "thread",
    ("queue.py", "get"): "queue",
    ("queue.py", "put"): "queue",
    ("_base.py", "result"): "future",
    ("_base.py", "wait"): "future",
}
MAX_FRAMES = 60


class Cells:
    """Which cell a code file is: a kernel's compile cache (file name -> number)."""

    def __init__(self, numbers: dict | None = None, prefix: str = ""):
        self.numbers = numbers if numbers is not None else {}
        self.prefix = prefix

    def label(self, filename: str, line: int) -> str | None:
        number = self.numbers.get(filename)
        return None if number is None else f"{self.prefix}cell {number}, line {line}"


def own(filename: str) -> bool:
    """nbrpc's, torch's or the standard library's frame (folded in stacks)."""
    return filename.startswith((_NBRPC, _TORCH, _STDLIB)) or filename.startswith("<frozen")


def local_threads(cells: Cells | None = None) -> list[dict]:
    """Every thread of this process with its frames, outermost first. A thread started
    by Python has its own name; one of torch's (its RPC threads, which run the calls'
    functions) has none there, and is named "torch RPC thread N" (``"torch": True``)."""
    names = {t.ident: t.name for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
    threads = []
    unnamed = 0
    for ident, frame in sorted(sys._current_frames().items()):
        frames = []
        while frame is not None and len(frames) < MAX_FRAMES:
            code = frame.f_code
            line = frame.f_lineno or 0
            entry = {"file": code.co_filename, "line": line, "function": code.co_name,
                     "code": linecache.getline(code.co_filename, line).strip()}
            label = cells.label(code.co_filename, line) if cells is not None else None
            if label:
                entry["cell"] = label
            frames.append(entry)
            frame = frame.f_back
        frames.reverse()
        name = names.get(ident)
        thread = {"id": ident, "name": name, "frames": frames}
        if name is None:
            unnamed += 1
            thread.update(name=f"torch RPC thread {unnamed}", torch=True)
        threads.append(thread)
    return threads


def relabel(threads: list[dict], cells: Cells) -> None:
    """Give frames of ``cells``' files (the driver's cells, run on a worker) their cell
    and source line, in place."""
    for thread in threads:
        for frame in thread["frames"]:
            if "cell" not in frame:
                label = cells.label(frame["file"], frame["line"])
                if label:
                    frame["cell"] = label
                    frame["code"] = frame["code"] or linecache.getline(frame["file"], frame["line"]).strip()


def where(frame: dict) -> str:
    """A frame as the user knows it: "cell 3, line 6", or file and line."""
    return frame.get("cell") or f"{os.path.basename(frame['file'])}, line {frame['line']}"


def fold(frames: list[dict]) -> list[dict]:
    """Runs of nbrpc's, torch's and the interpreter's frames as one ``{"folded": n}``."""
    out: list[dict] = []
    for frame in frames:
        if own(frame["file"]) and "cell" not in frame:
            if out and "folded" in out[-1]:
                out[-1]["folded"] += 1
            else:
                out.append({"folded": 1})
        else:
            out.append(frame)
    return out


def innermost_user(frames: list[dict]) -> dict | None:
    for frame in reversed(frames):
        if not own(frame["file"]) or "cell" in frame:
            return frame
    return None


def blocked_at(frames: list[dict]) -> dict | None:
    """What a thread waits on, from its innermost frames: ``{"what", "file", "line",
    "code", "cell"?}`` at the user's line, or None if it seems to run."""
    if not frames:
        return None
    inner = frames[-1]
    user = innermost_user(frames)
    if user is None:
        return None
    what = None
    if own(inner["file"]) and "cell" not in inner:
        what = _WAITS.get((os.path.basename(inner["file"]), inner["function"]))
        if what == "condition" and len(frames) > 1 and frames[-2]["file"] == _THREADING \
                and frames[-2]["function"] == "wait":  # Event.wait around Condition.wait
            what = "event"
    elif inner is user:
        code = user.get("code", "")
        if code.startswith("with ") or ".acquire(" in code:
            what = "lock"
        elif ".wait(" in code or ".result(" in code:
            what = "future"
        elif ".get(" in code:
            what = "queue"
    if what is None:
        return None
    out = {"what": what, "file": user["file"], "line": user["line"], "code": user.get("code", "")}
    if "cell" in user:
        out["cell"] = user["cell"]
    return out


def format_stacks(stacks: dict) -> str:
    """``nbrpc.stacks()``'s answer as text: each member, each thread, its frames folded."""
    lines = []
    for name, member in stacks.items():
        state = member.get("state", "running")
        head = f"{name} (pid {member.get('pid', '?')})"
        if state != "running":
            lines.append(f"{head}: {state}" + (f" ({member['why']})" if member.get("why") else ""))
            continue
        lines.append(head)
        for thread in member["threads"]:
            serving = f", serving {thread['serving']}" if thread.get("serving") else ""
            name = thread["name"] if thread.get("torch") else f"thread {thread['name']}"
            lines.append(f"  {name}{serving}")
            for frame in fold(thread["frames"]):
                if "folded" in frame:
                    lines.append(f"    ... {frame['folded']} nbrpc/torch/library frame{'s' * (frame['folded'] > 1)}")
                else:
                    code = f": {frame['code']}" if frame.get("code") else ""
                    lines.append(f"    {where(frame)} in {frame['function']}{code}")
    return "\n".join(lines)
