"""Stop a remote call when its caller is interrupted (the notebook's stop button).

Parts:

- ``Stoppable``: what the caller sends instead of a Python function. It carries a
  call id; on the worker it records which RPC thread runs the call, runs it, and
  forgets the thread again. What the call writes is sent to the driver before its
  reply leaves (see ``output``).
- ``stop(call_id)``: run on the worker by a small RPC from the caller; raises
  ``KeyboardInterrupt`` in the thread running that call, and in no other.
- ``send_stop``: the caller's side of it.

An asynchronous exception lands at the next bytecode the thread runs: pure-Python
loops and ``time.sleep`` in small steps stop at once, a long C call (one big
``time.sleep``, a large matrix product) stops when it returns.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
from collections.abc import Callable

import torch

from .._compat import torch_compat
from ..recording import recorder
from ..recording.pending import PENDING
from . import output

_lock = threading.Lock()
# call id -> id of the thread running it, in this process (as a worker).
_running: dict[str, int] = {}
# Calls stopped before they started here (their stop overtook them in the queue).
_stopped_early: set[str] = set()
EARLY_LIMIT = 10_000

_ids = itertools.count()


def new_call_id() -> str:
    return f"{os.getpid()}-{next(_ids)}"


def can_stop(func: Callable) -> bool:
    """True for a Python function torch sends as such (not a builtin operator, a
    TorchScript function or an ``@async_execution`` function, which it runs differently)."""
    return (
        torch_compat.find_builtin(func) is None
        and not isinstance(func, torch.jit.ScriptFunction)
        and not hasattr(func, torch_compat.ASYNC_EXECUTION_MARK)
    )


class Stoppable:
    """``func`` sent with a call id, so that ``stop(call_id)`` can reach its thread."""

    # (call id, whether a reply is pickled) of a recorded call: see ``recorder``.
    trace: tuple | None = None

    def __init__(self, func: Callable, call_id: str, trace: tuple | None = None):
        self.func, self.call_id = func, call_id
        # torch's RPC profiler names the call by the function it is given.
        self.__qualname__ = _what(func)
        if trace is not None:
            self.trace = trace

    def __reduce__(self):
        # The function, the id and a recorded call's trace only: the smallest message,
        # and the least to unpickle.
        if self.trace is None:
            return Stoppable, (self.func, self.call_id)
        return Stoppable, (self.func, self.call_id, self.trace)

    def __call__(self, *args, **kwargs):
        torch_compat.keep_thread_state()
        output.begin()
        PENDING.serving(self.call_id, self.func)
        try:
            if self.trace is None:
                return self._run(args, kwargs)
            half = recorder.started(self.trace, self.func, args)
            error = None
            try:
                return self._run(args, kwargs)
            except BaseException as e:
                error = e
                raise
            finally:
                recorder.finished(half, self.trace, error)
        except Exception as e:
            # torch would print the error to stderr after this returns, when the call's
            # output has gone: its print and reply made here are part of the call.
            return torch_compat.remote_exception(e)
        finally:
            PENDING.done(self.call_id)
            output.end()

    def _run(self, args, kwargs):
        me = threading.get_ident()
        try:
            with _lock:
                if self.call_id in _stopped_early:
                    _stopped_early.discard(self.call_id)
                    raise KeyboardInterrupt
                _running[self.call_id] = me
            try:
                return self.func(*args, **kwargs)
            finally:
                _forget(self.call_id, me)
        except KeyboardInterrupt:
            # A plain exception, so torch answers the (gone) caller as for any error
            # and the RPC thread goes on serving calls.
            raise RuntimeError(f"{_what(self.func)} was stopped: its caller was interrupted") from None


def _forget(call_id: str, thread: int) -> None:
    with _lock:
        if _running.pop(call_id, None) is None:
            # stop() took it: a stop that came as the function returned must not hit
            # this thread's next call.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)


def stop(call_id: str) -> bool:
    """Raise ``KeyboardInterrupt`` in the thread running call ``call_id`` (run on the
    worker over RPC); True if it was running."""
    with _lock:
        thread = _running.pop(call_id, None)
        if thread is None:
            if len(_stopped_early) >= EARLY_LIMIT:
                _stopped_early.clear()
            _stopped_early.add(call_id)
            return False
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread), ctypes.py_object(KeyboardInterrupt))
        return True


def send_stop(to, call_id: str) -> None:
    """Ask worker ``to`` to stop call ``call_id``; does not wait for the answer."""
    try:
        torch_compat.invoke_rpc(to, stop, torch_compat.RPCExecMode.ASYNC, (call_id,), None, 10.0)
    except (RuntimeError, ValueError):  # the worker is gone (or unknown): nothing runs there
        pass


def _what(func: Callable) -> str:
    return getattr(func, "__qualname__", repr(func))
