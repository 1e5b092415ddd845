"""What a debugger holds on this member: the calls paused in it, and the last failure of
each caller's calls, for a post-mortem.

Parts:

- ``Paused``: one per process (``PAUSED``). A debugger that stops a thread (pdb through
  ``breakpoint()``, JupyterLab's debugger) tells it ``pause`` with where the thread
  stands, and ``resume`` as it lets the thread go on; ``report`` copies it for
  ``diagnostics.waits``, which says "paused in the debugger at cell N, line M" instead
  of a hang. ``was_paused(call_id)`` stays true after the call went on, so that its
  caller knows a timeout is the person's stepping, not a hang: a call that paused keeps
  its outcome (``ended``) for its caller to collect after its timeout (``outcome``).
  Only the last ``OUTCOME_LIMIT`` such calls' outcomes are kept.
- ``Failures``: one per process (``FAILURES``): the error the last failed call of each
  caller (the process that made it, named by the call id's pid) raised here, with its
  traceback and so its frames' locals, for ``%debug``. Only the last: a caller's next
  failure replaces it, and the frames it kept are freed.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import torch

from .._compat import torch_compat

# Calls that paused once, remembered for their callers' timeouts: at most this many.
PAUSED_LIMIT = 10_000
# The outcomes of calls that paused, kept for callers whose wait timed out meanwhile.
OUTCOME_LIMIT = 16


class Paused:
    """The threads of this member stopped in a debugger now, by thread ident."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every pause (a new member, after a fork)."""
        self._lock = threading.Lock()
        self.threads: dict[int, dict] = {}
        self._ever: set[str] = set()
        self.paused_any = False  # a call paused here once: calls' ends look at ``ended``
        # call id -> a Future of its reply (its value, or the RemoteException torch sends).
        self._outcomes: collections.OrderedDict[str, torch.futures.Future] = collections.OrderedDict()

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
                self.paused_any = True
                if call_id not in self._outcomes:
                    self._outcomes[call_id] = torch.futures.Future()
                    while len(self._outcomes) > OUTCOME_LIMIT:
                        self._outcomes.popitem(last=False)

    def resume(self) -> None:
        """This thread goes on."""
        with self._lock:
            self.threads.pop(threading.get_ident(), None)

    def was_paused(self, call_id: str | None) -> bool:
        return call_id is not None and call_id in self._ever

    def ended(self, call_id: str, reply) -> None:
        """Call ``call_id`` ended with ``reply``: kept if it paused (see ``outcome``)."""
        with self._lock:
            fut = self._outcomes.get(call_id)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    def outcome(self, call_id: str) -> torch.futures.Future:
        """A Future of call ``call_id``'s reply, which its caller stopped waiting for."""
        with self._lock:
            fut = self._outcomes.get(call_id)
        if fut is None:
            fut = torch.futures.Future()
            fut.set_exception(LookupError(
                f"call {call_id} did not pause here, or its outcome was dropped "
                f"(only the last {OUTCOME_LIMIT} paused calls' outcomes are kept)"))
        return fut

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
        """Call ``call_id`` failed with ``error``: its caller's last failure from now on
        (inside the ``except`` that caught it: a paused call's reply is made from it)."""
        with self._lock:
            self._last[caller_of(call_id)] = (call_id, error)
        if PAUSED.was_paused(call_id):
            PAUSED.ended(call_id, torch_compat.remote_exception(error, show=False))

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
