"""What a debugger holds on this member: the calls paused in it, and the last failure of
each caller's calls, for a post-mortem.

Parts:

- ``Paused``: one per process (``PAUSED``). A debugger that stops a thread (pdb through
  ``breakpoint()``, JupyterLab's debugger) tells it ``pause`` with where the thread
  stands, and ``resume`` as it lets the thread go on; ``report`` copies it for
  ``diagnostics.waits``, which says "paused in the debugger at cell N, line M" instead
  of a hang. ``was_paused(call_id)`` stays true after the call went on, so that its
  caller knows a timeout is the person's stepping, not a hang.
- ``Failures``: one per process (``FAILURES``): the error the last failed call of each
  caller (the process that made it, named by the call id's pid) raised here, with its
  traceback and so its frames' locals, for ``%debug``. Only the last: a caller's next
  failure replaces it, and the frames it kept are freed.
"""

from __future__ import annotations

import os
import threading
import time

# Calls that paused once, remembered for their callers' timeouts: at most this many.
PAUSED_LIMIT = 10_000


class Paused:
    """The threads of this member stopped in a debugger now, by thread ident."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every pause (a new member, after a fork)."""
        self._lock = threading.Lock()
        self.threads: dict[int, dict] = {}
        self._ever: set[str] = set()

    def pause(self, call_id: str | None, file: str, line: int, how: str = "pdb") -> None:
        """This thread (serving call ``call_id``, or None) stopped at ``file``:``line``."""
        entry = {"thread": threading.get_ident(), "call": call_id, "file": file, "line": line,
                 "how": how, "since": time.time()}
        with self._lock:
            self.threads[entry["thread"]] = entry
            if call_id is not None:
                if len(self._ever) >= PAUSED_LIMIT:
                    self._ever.clear()
                self._ever.add(call_id)

    def resume(self) -> None:
        """This thread goes on."""
        with self._lock:
            self.threads.pop(threading.get_ident(), None)

    def was_paused(self, call_id: str | None) -> bool:
        return call_id is not None and call_id in self._ever

    def report(self) -> list[dict]:
        """The paused threads as plain data."""
        with self._lock:
            return [dict(entry) for entry in self.threads.values()]


class Failures:
    """The last failure of each caller's calls on this member."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[str, BaseException]] = {}

    def keep(self, call_id: str, error: BaseException) -> None:
        """Call ``call_id`` failed with ``error``: its caller's last failure from now on."""
        with self._lock:
            self._last[caller_of(call_id)] = (call_id, error)

    def find(self, call_id: str) -> BaseException | None:
        """The error call ``call_id`` failed with, if it is still its caller's last."""
        with self._lock:
            kept = self._last.get(caller_of(call_id))
        return kept[1] if kept is not None and kept[0] == call_id else None

    def clear(self) -> None:
        """Free every kept failure (leaving the group)."""
        with self._lock:
            self._last.clear()


def caller_of(call_id: str) -> str:
    """The process that made call ``call_id``: the pid its id starts with."""
    return call_id.split("-", 1)[0]


PAUSED = Paused()
FAILURES = Failures()
os.register_at_fork(after_in_child=PAUSED.reset)
os.register_at_fork(after_in_child=FAILURES.reset)
