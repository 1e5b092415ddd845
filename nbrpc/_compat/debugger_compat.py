"""The private parts of debugpy (its vendored pydevd) and of torch's autograd that the
cluster's debugger uses.

- ``on_suspend``: pydevd stops a thread in ``PyDB.do_wait_suspend``, which runs on that
  thread until the person lets it go on (continue, or a step, which stops again in a
  new call); wrapped, it tells nbrpc that the thread is paused and where (debugpy 1.8,
  both its ``settrace`` and its ``sys.monitoring`` tracing call it by attribute).
- ``before_backward``: torch runs a Python autograd Function's backward through
  ``torch.autograd.function.BackwardCFunction.apply`` (``apply_boxed`` too, from torch
  2.13), on a thread its C++ engine made (a distributed backward: one of ``at::launch``'s
  threads), holding the GIL afresh for each node: a hook run there, in the same hold,
  can make that thread known to debugpy before the user's backward runs. Known to work
  with torch 2.11 to 2.15.
- ``accept_breakpoints_in``: pydevd refuses a breakpoint in a file that is not on this
  machine (``PyDevdAPI.add_breakpoint`` asks ``pydevd_file_utils.exists``, by attribute);
  wrapped, it also takes one in a file the worker holds in memory (a driver's cell on a
  host where the driver's path cannot be written), whose code runs under that name.

``tests/test_compat.py`` reads all three.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable

from torch.autograd import function as autograd_function

_BACKWARD_ENTRIES = ("apply", "apply_boxed")
_lock = threading.Lock()


def pydevd_debugger_class():
    """pydevd's ``PyDB``, once debugpy has loaded it (a kernel's debugger started), else None."""
    pydevd = sys.modules.get("pydevd")
    return getattr(pydevd, "PyDB", None)


def on_suspend(pausing: Callable, resuming: Callable) -> bool:
    """``pausing(frame)`` as pydevd stops a thread at ``frame``, ``resuming()`` as it goes
    on, both on that thread (once per process: later calls change nothing). False if
    debugpy has not loaded pydevd."""
    debugger_class = pydevd_debugger_class()
    if debugger_class is None:
        return False

    def wrap(plain):
        @functools.wraps(plain)
        def do_wait_suspend(self, thread, frame, *args, **kwargs):
            pausing(frame)
            try:
                return plain(self, thread, frame, *args, **kwargs)
            finally:
                resuming()

        return do_wait_suspend

    _wrap_once(debugger_class, "do_wait_suspend", wrap)
    return True


def _wrap_once(owner, name: str, wrap: Callable[[Callable], Callable]) -> None:
    """``owner.name`` replaced by ``wrap(owner.name)``, unless it already was (the plain
    one is kept on the wrapper as ``_nbrpc_plain``)."""
    with _lock:
        plain = getattr(owner, name)
        if getattr(plain, "_nbrpc_plain", None) is not None:
            return
        wrapped = wrap(plain)
        wrapped._nbrpc_plain = plain
        setattr(owner, name, wrapped)


def before_backward(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook()`` on the thread of every Python autograd Function's backward, before
    it; returns the function that undoes it."""
    cls = autograd_function.BackwardCFunction
    plains = {name: vars(cls)[name] for name in _BACKWARD_ENTRIES if name in vars(cls)}

    def wrapped(plain):
        @functools.wraps(plain)
        def entry(self, *args):
            hook()
            return plain(self, *args)

        return entry

    with _lock:
        for name, plain in plains.items():
            setattr(cls, name, wrapped(plain))

    def undo() -> None:
        with _lock:
            for name, plain in plains.items():
                setattr(cls, name, plain)

    return undo


def accept_breakpoints_in(held: Callable[[str], bool]) -> bool:
    """pydevd takes breakpoints in the files ``held(path)`` names, on disk or not (once
    per process: later calls change nothing). False if debugpy has not loaded pydevd."""
    file_utils = sys.modules.get("pydevd_file_utils")
    if file_utils is None:
        return False

    def wrap(plain):
        @functools.wraps(plain)
        def exists(filename):
            return plain(filename) or held(filename)

        return exists

    _wrap_once(file_utils, "exists", wrap)
    return True
