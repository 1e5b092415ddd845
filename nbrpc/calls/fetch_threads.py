"""Threads that make blocking torch calls (``to_here``) while the main thread waits in
a way the stop button can interrupt (``waiting.in_background``)."""

from __future__ import annotations

import _thread
import os
import threading
from collections.abc import Callable


def take() -> Helper:
    """An idle helper, or a new one."""
    return idle.pop() if idle else Helper()


class Helper:
    """A thread that makes blocking torch calls (``to_here``) for the main thread.

    A lock hands it a call, and a new held lock per call, released when the call is
    over, hands the main thread the outcome: less than an executor's future and
    condition, on a path every ``to_here`` takes. It is idle again (``idle``) as soon
    as its call is over, so one whose waiter was interrupted is taken again only then."""

    def __init__(self):
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._job: tuple | None = None
        self._result = self._error = None
        self._abandoned = False
        self._state = threading.Lock()
        threading.Thread(target=self._serve, name="nbrpc-wait", daemon=True).start()

    def start(self, call: Callable):
        """Hand ``call`` over; returns a held lock, released when it is over."""
        done = _thread.allocate_lock()
        done.acquire()
        self._job = (call, done)
        self._go.release()
        return done

    def abandon(self) -> None:
        """The waiter was interrupted: drop the outcome when the call is over."""
        with self._state:
            if self in idle:  # over already
                self._result = self._error = None
            else:
                self._abandoned = True

    def outcome(self):
        """What the call returned, or raise what it raised."""
        result, error = self._result, self._error
        self._result = self._error = None
        if error is not None:
            try:
                raise error
            finally:
                del error  # its traceback holds the call's frames
        return result

    def _serve(self) -> None:
        while True:
            self._go.acquire()
            call, done = self._job
            self._job = None
            self._result = self._error = None
            try:
                self._result = call()
            except BaseException as e:
                self._error = e
            # Hold nothing of the call while idle: it may hold an RRef, or a result's
            # value, that must go when its user drops it.
            del call
            with self._state:
                if self._abandoned:  # no one will ask for the outcome
                    self._result = self._error = None
                    self._abandoned = False
                idle.append(self)  # before the release: the waiter may want a helper at once
            done.release()
            del done


idle: list[Helper] = []  # helpers waiting for a call, kept between calls
os.register_at_fork(after_in_child=idle.clear)  # their threads are not in a child
