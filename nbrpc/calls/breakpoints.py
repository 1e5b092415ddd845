"""pdb on a member, prompting in the cell that made the call.

Parts:

- ``install``: ``sys.breakpointhook`` and ``pdb.set_trace``, on a thread that serves a
  call, open a ``MemberPdb`` on the caller's frame; anywhere else (a ``%%rpc_on`` cell on
  the worker's kernel, the driver's own cells) they do what they did before.
- ``MemberPdb``: torch's and nbrpc's frames left out of its stack and never stepped into;
  its stdin and stdout a ``prompts.Channel`` to the driver's waiting cell; while it
  waits for a command the thread is in ``PAUSED``, so that a paused call reads as
  paused, not as a hang. The driver's cell sources are fetched once for ``list``.
- ``post_mortem(call_id)``: run over RPC by ``%debug`` on the driver: pdb in the frames
  of the last failed call of that caller (``paused.FAILURES``), through the same prompts.
- ``failed_on`` / ``failure_of``: the driver's note on a remote error of which member and
  call it came from, which ``%debug`` reads.
- ``REMOTES``: the call id of each of the last remotes made here, by RRef: a ``to_here``
  that raises the error the remote's function raised on the owner notes that call.
"""

from __future__ import annotations

import collections
import inspect
import os
import pdb
import sys
import threading
import weakref
from collections.abc import Callable

import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ..recording.functions import destination_name
from ..recording.paused import FAILURES, PAUSED
from ..recording.pending import OWN_FOLDERS
from ..wire import remote_errors
from . import interrupts, prompts, stopping

# Modules pdb never stops in: stepping out of a call's function runs nbrpc and torch on.
SKIP = ("nbrpc.*", "torch.*", "threading", "concurrent.*")
# How long a caller waits for its callee to say whether a timed-out call paused (seconds).
ASK_TIMEOUT = 10.0
# The attribute a remote error carries on the driver: (member, call id).
FAILED_CALL = "_nbrpc_failed_call"
# Remotes whose call id a later to_here's error can name: at most this many, the newest.
REMOTES_KEPT = 256


class MemberPdb(pdb.Pdb):
    """pdb for a call served on this member, prompting in the caller's cell."""

    def __init__(self, member: str, call_id: str | None, where: tuple):
        self.call_id = call_id
        channel = prompts.Channel(member, call_id, where)
        super().__init__(stdin=channel, stdout=channel, skip=SKIP, nosigint=True, readrc=False)

    def setup(self, f, tb):
        done = super().setup(f, tb)
        first = next((i for i, (frame, _) in enumerate(self.stack) if not _own(frame)), 0)
        if first:  # the serving thread's frames above the call's function
            self.stack = self.stack[first:]
            self.curindex = max(0, self.curindex - first)
            self.curframe = self.stack[self.curindex][0]
            self.curframe_locals = self.curframe.f_locals
        return done

    def set_continue(self):
        super().set_continue()
        self.stdout.end_session()

    def set_quit(self):
        super().set_quit()
        self.stdout.end_session()

    def interaction(self, frame, traceback):
        at = frame if frame is not None else _innermost(traceback)
        line = at.f_lineno if frame is not None else _innermost_line(traceback)
        prompts.fetch_sources({f.f_code.co_filename for f in _frames(at)})
        PAUSED.pause(self.call_id, at.f_code.co_filename, line)
        try:
            super().interaction(frame, traceback)
        finally:
            PAUSED.resume()


def _own(frame) -> bool:
    """Whether ``frame`` is nbrpc's, torch's or the thread machinery's."""
    return frame.f_code.co_filename.startswith(OWN_FOLDERS) or frame.f_globals.get("__name__") == "threading"


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _innermost(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


def _innermost_line(tb) -> int:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_lineno


def _member() -> str:
    return torch_compat.current_agent().get_worker_info().name


def _where(what: str, frame) -> tuple:
    """What stopped where, for the line the driver says if it cannot prompt."""
    return what, frame.f_code.co_name, frame.f_code.co_filename, frame.f_lineno


class _Hooks:
    """What ``breakpoint()`` and ``pdb.set_trace`` did before ``install``."""

    def __init__(self):
        self.lock = threading.Lock()
        self.breakpointhook = None
        self.set_trace = None


_before = _Hooks()
_STDLIB_SET_TRACE = pdb.set_trace


def install() -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` prompt in the caller's cell on a
    thread that serves a call (idempotent)."""
    with _before.lock:
        if _before.breakpointhook is None:
            _before.breakpointhook, sys.breakpointhook = sys.breakpointhook, breakpointhook
            _before.set_trace, pdb.set_trace = pdb.set_trace, set_trace


def breakpointhook(*args, **kwargs):
    """``sys.breakpointhook``: pdb in the caller's cell on a thread serving a call, unless
    JupyterLab's debugger is attached here (debugpy's hook then stops in it)."""
    served = interrupts.served_here()
    if served is None or os.environ.get("PYTHONBREAKPOINT") == "0" or _debugger_attached():
        hook = _hook_before()
        if hook is sys.__breakpointhook__ and not os.environ.get("PYTHONBREAKPOINT"):
            return _set_trace_before(sys._getframe(1), None)  # pdb on the caller's frame, not this one
        return hook(*args, **kwargs)
    _trace(served, sys._getframe(1), "breakpoint()")
    return None


def _debugger_attached() -> bool:
    """Whether a debug adapter client (JupyterLab's debugger) is attached to this process."""
    debugpy = sys.modules.get("debugpy")
    return debugpy is not None and debugpy.is_client_connected()


def _hook_before():
    """The hook ``breakpoint()`` had: debugpy's (a kernel's debugger imported it) only while
    a client is attached, since with none it stops nowhere; else Python's own, pdb."""
    hook = _before.breakpointhook
    if getattr(hook, "__name__", "") == "debugpy_breakpointhook" and not _debugger_attached():
        return sys.__breakpointhook__
    return hook


def set_trace(*, header=None):
    """``pdb.set_trace``: the same as ``breakpoint()`` on a thread serving a call."""
    served = interrupts.served_here()
    frame = sys._getframe(1)
    if served is None:
        return _set_trace_before(frame, header)
    _trace(served, frame, "pdb.set_trace()")
    return None


def _set_trace_before(frame, header):
    """``pdb.set_trace`` as it was (the standard library's, or IPython's in a kernel), on
    ``frame``: called from here, either would stop in this module's frame."""
    if _before.set_trace is _STDLIB_SET_TRACE:
        debugger = pdb.Pdb()
        if header is not None:
            debugger.message(header)
        return debugger.set_trace(frame)
    if "frame" in inspect.signature(_before.set_trace).parameters:  # IPython's
        return _before.set_trace(frame=frame, header=header)
    return _before.set_trace(header=header) if header is not None else _before.set_trace()


def _trace(served: interrupts.Served, frame, what: str) -> None:
    debugger = MemberPdb(_member(), served.call_id, _where(what, frame))
    debugger.set_trace(frame)


def post_mortem(call_id: str) -> None:
    """Run over RPC by ``%debug``: pdb in the frames of failed call ``call_id``."""
    error = FAILURES.find(call_id)
    member = _member()
    if error is None:
        raise LookupError(f"{member} no longer keeps that failure: it keeps only the last failed call of "
                          "each caller. Run the failing call again, then %debug")
    tb = error.__traceback__
    while tb is not None and _own(tb.tb_frame) and tb.tb_next is not None:
        tb = tb.tb_next  # the serving thread's frames above the call's function
    served = interrupts.served_here()
    frame = _innermost(tb)
    debugger = MemberPdb(member, served.call_id if served else None,
                         _where(f"%debug of {type(error).__name__}", frame))
    debugger.reset()
    try:
        debugger.interaction(None, tb)
    finally:
        debugger.stdout.end_session()


def stepped_through(error: BaseException, to, call_id: str | None) -> bool:
    """Whether ``error`` is the timeout of call ``call_id`` to ``to`` whose callee paused
    in a debugger: a person stepped through it, and its caller waits on for its reply
    (``outcome``), with no timeout."""
    if call_id is None or not stopping.timed_out(error):
        return False
    if prompts.asked_for(call_id):
        return True
    try:  # a call of a call: its debugger asked the driver, not this member
        return bool(torch_compat.invoke_rpc(to, was_paused, torch_compat.RPCExecMode.SYNC, (call_id,),
                                            None, ASK_TIMEOUT).wait())
    except RuntimeError:  # gone, or not answering: the timeout stands
        return False


def was_paused(call_id: str) -> bool:
    """Run on a callee: whether call ``call_id`` paused in a debugger here."""
    torch_compat.keep_thread_state()
    return PAUSED.was_paused(call_id)


def outcome(call_id: str) -> torch.futures.Future:
    """Run on a callee: a Future of the reply of call ``call_id``, which paused here and
    whose caller's wait timed out meanwhile (an ``@async_execution`` function)."""
    torch_compat.keep_thread_state()
    return PAUSED.outcome(call_id)


torch_compat.mark_async_execution(outcome)


def after_pause(to, call_id: str):
    """The reply of call ``call_id``, whose wait timed out while its callee was paused in
    a debugger: waited for with no timeout (the person steps), through nbrpc's
    ``rpc_sync`` (installed in every member): interruptibly, the prompts answered."""
    try:
        return rpc.rpc_sync(to, outcome, args=(call_id,), timeout=0)
    except Exception as e:  # the call's own error, of its own class
        failed_on(e, to, call_id)
        raise e from None


def noting(note: Callable | None, to, call_id: str | None) -> Callable:
    """``note``, and for a remote error (of class ``RuntimeError``, which torch keeps) which
    call it came from, for ``%debug`` (``failed_on``)."""
    def noted(named: Exception) -> None:
        if note is not None:
            note(named)
        if not isinstance(named, remote_errors.CALL_ERRORS):
            failed_on(named, to, call_id)

    return noted


def failed_on(error: BaseException, to, call_id: str | None) -> None:
    """On the caller: ``error`` came from call ``call_id`` to ``to`` (for ``%debug``)."""
    if call_id is None:
        return
    name = destination_name(to)
    try:
        setattr(error, FAILED_CALL, (name, call_id))
    except (AttributeError, TypeError):  # an exception class that takes no attributes
        pass


def failure_of(error: BaseException | None) -> tuple[str, str] | None:
    """(member, call id) of the call a remote ``error`` came from, if known."""
    return getattr(error, FAILED_CALL, None)


class Remotes:
    """The call id of each of the last ``REMOTES_KEPT`` remotes made here, by their RRef."""

    def __init__(self) -> None:
        self._made: collections.OrderedDict[int, tuple] = collections.OrderedDict()

    def made(self, rref, call_id: str) -> None:
        self._made[id(rref)] = (weakref.ref(rref), call_id)
        if len(self._made) > REMOTES_KEPT:
            try:
                self._made.popitem(last=False)
            except KeyError:  # another thread took the oldest meanwhile
                pass

    def call_of(self, rref) -> str | None:
        """The call id of the remote that made ``rref`` here, if it is among the last."""
        ref, call_id = self._made.get(id(rref), (None, None))
        return call_id if ref is not None and ref() is rref else None


REMOTES = Remotes()
