"""Stop a remote call when its caller is interrupted (the notebook's stop button) or
gives up on it (its timeout), nested calls included.

Parts:

- ``Stoppable``: what the caller sends instead of a Python function. It carries a
  call id and goes as an ``@async_execution`` function: torch's thread hands it to a
  serving thread (``serving``), which records itself as running the call (a
  ``Served``), runs it, and forgets it again. What the call writes is sent to the
  driver before its reply leaves (see ``output``).
- ``Served``: one call this member runs: its thread, whether it was stopped, the calls
  it makes itself and waits on (``calling`` / ``called``), and the lock its thread
  waits on for one of them, if any (``waiting``).
- ``stop(call_id)``: run on the worker by a small RPC from the caller. It stops the
  call's own calls first (on their members, the same way), then wakes the call's
  thread if it waits on one of them, else raises ``KeyboardInterrupt`` in it; and
  answers, after at most ``STOP_GRACE`` s, what became of the call: ``STOPPED``,
  ``STILL_RUNNING``, ``NOT_RUNNING`` (``LEFT_TO_RUN`` after a timeout, which lets a call
  that has not begun run, as torch does), ``ENDED`` and the error it had ended with, or
  ``UNSET`` (an ``Awaited`` call's future).
- ``Awaited``: what the caller sends for an ``@async_execution`` function, whose future
  not yet complete is kept in ``PENDING``.
- ``send_stop``: the caller's side of it; a Future of that answer.

An asynchronous exception lands at the next bytecode the thread runs: pure-Python
loops and ``time.sleep`` in small steps stop at once, a long C call (one big
``time.sleep``, a large matrix product, a lock's ``acquire`` without a timeout) stops
when it returns; a wait on another call stops at once.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import os
import threading
import types
import weakref
from collections.abc import Callable

import torch

from .._compat import torch_compat
from ..errors import RpcTimeoutError, WorkerDiedError
from ..recording import functions, futures, recorder
from ..recording.paused import FAILURES, PAUSED
from ..recording.pending import PENDING
from ..wire import cloudpickling, remote_errors
from ..wire.plain_values import PLAIN_VALUES
from ..wire.receivers import receivers
from . import output, serving

# What ``stop`` answers.
STOPPED = "stopped"  # the call ended after the stop
STILL_RUNNING = "still running"  # it had not ended ``STOP_GRACE`` s after the stop
NOT_RUNNING = "not running"  # it had ended already, or had not begun (it will not run)
# A timeout's stop: it had ended already, or had not begun (it runs when it begins, as torch runs it).
LEFT_TO_RUN = "not running; left to run"
UNSET = "future unset"  # its @async_execution function's future was still not complete
ENDED = "ended with "  # it had ended with this error (the rest of the answer) before the stop came
# How long ``stop`` waits for a stopped call to end before it answers (seconds): after
# the stop button, and after a timeout (whose caller waits at most ``TIMEOUT_ANSWER``
# s more for the answer: torch's error comes at its time, the stop goes on meanwhile).
STOP_GRACE = 2.0
TIMEOUT_STOP_GRACE = 0.02
TIMEOUT_ANSWER = 0.1
# Calls stopped before they started here (their stop overtook them): at most this many kept.
EARLY_LIMIT = 10_000


class _CallIds:
    """This process's call ids: its pid, then a count (a forked child starts its own)."""

    def __init__(self):
        self.prefix = f"{os.getpid()}-"
        self.count = itertools.count()


_ids = _CallIds()
os.register_at_fork(after_in_child=_ids.__init__)
# id() of a Python function outside torch -> (a weak reference to it, its carrier: ``sent_as``).
# The answer is the function's for good (``@async_execution`` makes a new function; torch's
# builtin table, which may grow as torch's modules are imported, holds torch's functions
# only, never the helpers behind an RRef's proxy); weak, so that no function is kept alive.
_carriers: dict[int, tuple] = {}
CARRIERS_KEPT = 1024


def new_call_id() -> str:
    return _ids.prefix + str(next(_ids.count))


def sent_as(func: Callable) -> type | None:
    """What carries ``func`` to its callee: ``Stoppable`` for a Python function torch
    sends as such, ``Awaited`` for an ``@async_execution`` one, None for a builtin
    operator or a TorchScript function, ``@async_execution`` or not (torch runs those
    itself): torch's own branches (``torch_compat.call_kind``), asked once per function."""
    known = _carriers.get(id(func))
    if known is not None and known[0]() is func:
        return known[1]
    kind, is_async = torch_compat.call_kind(func)
    carrier = None if kind != torch_compat.PYTHON else Awaited if is_async else Stoppable
    if type(func) is types.FunctionType and (not str(func.__module__).startswith("torch")
                                             or func in torch_compat.RREF_HELPERS):
        if len(_carriers) >= CARRIERS_KEPT:  # (ids of functions long gone, mostly)
            _carriers.clear()
        _carriers[id(func)] = (weakref.ref(func), carrier)
    return carrier


class Served:
    """A call this member runs (see the module's docstring)."""

    __slots__ = ("call_id", "thread", "stopped", "raised", "calling", "waiting", "ended")

    def __init__(self, call_id: str, thread: int):
        self.call_id, self.thread = call_id, thread
        self.stopped = False
        self.raised = False  # an asynchronous KeyboardInterrupt was set in its thread
        self.calling: dict[str, object] = {}  # call id -> destination, of its own calls
        self.waiting = None  # the lock its thread waits on for one of them
        self.ended: threading.Event | None = None  # made by a stop that waits for the end


class _Registry:
    """The calls this member runs, by call id and by thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: dict[str, Served] = {}
        self.by_thread: dict[int, Served] = {}
        self.stopped_early: set[str] = set()
        # call id -> the error a call ended with, in one line: a stop that comes after
        # it (its caller gave up as it failed) answers it, so the caller's error tells it.
        self.endings: dict[str, str] = {}

    def ended_with(self, call_id: str, error: BaseException) -> None:
        if len(self.endings) >= EARLY_LIMIT:
            self.endings.clear()
        self.endings[call_id] = one_line(error)

    def reset(self) -> None:
        self.__init__()


_served = _Registry()
os.register_at_fork(after_in_child=_served.reset)


def served_here() -> Served | None:
    """The call this thread runs for a caller, if any."""
    return _served.by_thread.get(threading.get_ident()) if _served.by_thread else None


class Carrier(tuple):
    """A Python function sent with a call id, so that ``stop(call_id)`` can reach its
    thread, and a recorded call's ``trace`` (call id, whether a reply is pickled: see
    ``recorder``; None if not recorded): the fields ``c_pickling`` reads by name; a call
    answered by a reply adds its caller's definitions origin (``receivers.replying``). A
    tuple, made as ``Stoppable((func, call_id, trace[, origin]))``, so that it is made, pickled
    (pickle's own ``NEWOBJ``) and rebuilt all in C, once on each side of every call (a
    ``NamedTuple``'s ``__new__`` and ``__getnewargs__`` are Python's, and pickle other bytes)."""

    __slots__ = ()

    func = property(operator.itemgetter(0))
    call_id = property(operator.itemgetter(1))
    trace = property(operator.itemgetter(2))

    def carrying(self, func) -> Carrier:
        """The same call, of the same class, carrying ``func`` instead (``c_pickling``
        puts a notebook function's reduction in its place)."""
        return tuple.__new__(type(self), (func, *self[1:]))

    def __getattr__(self, name: str):
        # torch's RPC profiler names the call by the function it is given.
        if name == "__qualname__":
            return _what(self[0])
        raise AttributeError(name)

    def serve(self, *args, **kwargs):
        """Run the call on this thread; its value, or the ``RemoteException`` torch sends."""
        func, call_id, trace = self[:3]
        output.begin()
        PENDING.serving(call_id, functions.named(func, args, here=True))
        try:
            if trace is None:
                value = _run(func, call_id, args, kwargs)
            else:
                value = _recorded(func, call_id, trace, args, kwargs)
            if len(self) > 3:
                if type(value) not in PLAIN_VALUES:  # its reply goes to the caller of this origin
                    receivers.replying(value, self[3])
            elif type(value).__module__ == "__main__":  # a remote's value, of a notebook class: any holder fetches it
                receivers.owning(value)
            return value
        except Exception as e:
            FAILURES.keep(call_id, e)  # for %debug on the caller
            # torch would print the error to stderr after this returns, when the call's
            # output has gone: its print and reply made here are part of the call.
            return remote_errors.reply(e, show=not passed_on(e))
        finally:
            PENDING.done(call_id)
            output.end()


def _recorded(func: Callable, call_id: str, trace: tuple, args: tuple, kwargs: dict):
    """``_run`` of a recorded call, its start and end recorded."""
    half = recorder.started(trace, func, args)
    error = None
    try:
        return _run(func, call_id, args, kwargs)
    except BaseException as e:
        error = e
        raise
    finally:
        recorder.finished(half, trace, error)


@torch_compat.mark_async_execution
class Stoppable(Carrier):
    """What the caller sends for a Python function. torch sends it as an
    ``@rpc.functions.async_execution`` function: the callee's RPC thread gets a Future
    back at once (see ``serving``)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        torch_compat.keep_thread_state()
        return serving.serve(self.serve, args, kwargs)


@torch_compat.mark_async_execution
class Awaited(Carrier):
    """What the caller sends for an ``@async_execution`` function. torch's thread runs it
    as torch would; a future it returns that is not complete is in ``PENDING`` until it
    completes, or its caller gives up (``stop``), so that one nobody completes is named
    with where it was made."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        func, call_id = self[0], self[1]
        torch_compat.keep_thread_state()
        fut = func(*args, **kwargs)
        if isinstance(fut, torch_compat.CppFuture) and not fut.done():
            PENDING.awaiting(call_id, functions.named(func, args, here=True), futures.made_at(fut))
            fut.add_done_callback(lambda _: PENDING.settled(call_id))
        return fut


cloudpickling.add_carrier(Stoppable)
cloudpickling.add_carrier(Awaited)


def _run(func: Callable, call_id: str, args: tuple, kwargs: dict):
    served = Served(call_id, threading.get_ident())
    try:
        with _served.lock:
            if call_id in _served.stopped_early:
                _served.stopped_early.discard(call_id)
                raise KeyboardInterrupt
            _served.running[call_id] = served
            outer = _served.by_thread.get(served.thread)
            _served.by_thread[served.thread] = served
        try:
            value = func(*args, **kwargs)
            if PAUSED.paused_any:  # its caller may have stopped waiting while a person stepped
                PAUSED.ended(call_id, value)
            return value
        except Exception as e:
            _served.ended_with(call_id, e)
            raise
        finally:  # forgotten (in this frame: it runs for every call)
            with _served.lock:
                _served.running.pop(call_id, None)
                if outer is None:
                    _served.by_thread.pop(served.thread, None)
                else:  # a call served inline by a thread that serves another (a call to itself)
                    _served.by_thread[served.thread] = outer
                if served.raised:
                    # A stop that came as the function returned must not hit the thread's next call.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(served.thread), None)
                if served.ended is not None:
                    served.ended.set()
    except KeyboardInterrupt:
        # A plain exception, so torch answers the (gone) caller as for any error.
        error = RuntimeError(f"{_what(func)} was stopped: its caller was interrupted or gave up on it")
        error.stopped = True
        raise error from None


def passed_on(error: BaseException) -> bool:
    """Whether ``error`` only passes on how a call ended elsewhere: a stop of this call
    (its caller gave up), a nested call's timeout or its worker's death, or an error a
    nested call raised (torch's text names where it arose). Where it arose said it, and
    the caller's error tells the chain: it is not written out again here."""
    return (getattr(error, "stopped", False) or isinstance(error, (RpcTimeoutError, WorkerDiedError))
            or "On WorkerInfo(" in str(error))


def one_line(error: BaseException) -> str:
    """``error`` as its class and its message's first sentence (its advice left out)."""
    lines = str(error).split("\n")
    text = lines[1] if lines[0].startswith("On WorkerInfo(") and len(lines) > 1 else lines[0]
    for advice in (". Pass timeout=", ". Start a new cluster", ". When it stopped:", ". Torch said:"):
        text = text.split(advice, 1)[0]
    return f"{type(error).__name__}: {text}"


# -- the calls a served call makes ------------------------------------------------------


def calling_from_here(to, call_id: str | None) -> Served | None:
    """This thread made call ``call_id`` (None: one that cannot be stopped) to ``to``:
    if it serves a call, a stop of that call stops this one too; that call, or None."""
    served = served_here() if call_id is not None else None
    if served is not None:
        with _served.lock:
            served.calling[call_id] = to
    return served


def called(served: Served | None, call_id: str) -> None:
    """``served``'s call ``call_id`` has its answer (None: no served call made it)."""
    if served is None:
        return
    with _served.lock:
        served.calling.pop(call_id, None)


def waiting(served: Served, lock) -> bool:
    """``served``'s thread waits on ``lock`` (None: no longer); False if it was stopped."""
    with _served.lock:
        served.waiting = lock
        return not served.stopped


# -- stopping --------------------------------------------------------------------------


def _stop_here(call_id: str, cancel: bool) -> tuple[Served | None, list]:
    """Mark call ``call_id`` stopped and reach its thread; its own calls, to stop too. One
    that has not begun will not run if ``cancel``."""
    with _served.lock:
        served = _served.running.get(call_id)
        if served is None:
            if cancel:
                if len(_served.stopped_early) >= EARLY_LIMIT:
                    _served.stopped_early.clear()
                _served.stopped_early.add(call_id)
            return None, []
        if served.stopped:
            return served, []
        served.stopped = True
        served.ended = threading.Event()
        nested = list(served.calling.items())
        if served.waiting is not None:
            release(served.waiting)  # it raises KeyboardInterrupt as it wakes
        else:
            served.raised = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(served.thread), ctypes.py_object(KeyboardInterrupt))
    return served, nested


def release(lock) -> None:
    """Release ``lock``, unless something released it already."""
    try:
        lock.release()
    except RuntimeError:  # its answer came at the same moment
        pass


def _stop(call_id: str, grace: float, cancel: bool) -> str:
    if PENDING.settled(call_id):  # its caller gave up on a future nobody completed
        return UNSET
    served, nested = _stop_here(call_id, cancel)
    if served is None:
        ending = _served.endings.pop(call_id, None)
        return (NOT_RUNNING if cancel else LEFT_TO_RUN) if ending is None else ENDED + ending
    answers = [send_stop(to, nested_id, grace, cancel) for nested_id, to in nested]
    for answer in answers:  # the nested calls end first: the waiting one wakes
        try:
            answer.wait()
        except RuntimeError:
            pass
    return STOPPED if served.ended.wait(grace) else STILL_RUNNING


def stop(call_id: str, grace: float = STOP_GRACE, cancel: bool = True) -> torch.futures.Future:
    """Stop call ``call_id`` on this member (run over RPC); a Future of what became of it
    within ``grace`` s (``STOPPED``, ``STILL_RUNNING``, ``NOT_RUNNING``). A call that has
    not begun (its message still unpickled, say) will not run if ``cancel`` (an interrupt);
    a timeout's stop leaves it to run (``LEFT_TO_RUN``), as torch runs a call whose caller
    gave up on it (torch's ``_all_gather`` needs its followers' calls to run). An
    ``@async_execution`` function, so the waiting happens on a serving thread."""
    torch_compat.keep_thread_state()
    return serving.hand_off(_stop, (call_id, grace, cancel), {})


torch_compat.mark_async_execution(stop)


def send_stop(to, call_id: str, grace: float = STOP_GRACE, cancel: bool = True) -> torch.futures.Future:
    """Ask member ``to`` to stop call ``call_id`` (``stop``; ``cancel`` False: a timeout's):
    a Future of its answer; its error if ``to`` is gone or does not answer."""
    try:
        return torch_compat.invoke_rpc(to, stop, torch_compat.RPCExecMode.ASYNC, (call_id, grace, cancel), None,
                                       grace + 8.0)
    except (RuntimeError, ValueError) as e:  # the worker is gone (or unknown)
        fut = torch.futures.Future()
        fut.set_exception(e)
        return fut


def stop_outcome(fut: torch.futures.Future, timeout: float = STOP_GRACE + 1.0) -> str | None:
    """The answer ``send_stop`` got, waiting at most ``timeout`` s; None without one."""
    if not answered(fut, timeout):
        return None
    try:
        return fut.value()
    except RuntimeError:
        return None


def answered(fut: torch.futures.Future, timeout: float) -> bool:
    """Whether ``fut`` (a stop's answer) is done, waiting at most ``timeout`` s for it."""
    if fut.done():
        return True
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    return done.wait(timeout)


def _what(func: Callable) -> str:
    return getattr(func, "__qualname__", repr(func))
