"""Make torch's blocking RPC calls behave in an interactive session.

Wrappers, installed in every member by ``group.join``:

- ``torch_compat.to_worker_info`` (every ``rpc_sync``, ``rpc_async`` and ``remote`` resolves
  its destination through it): an unknown name raises ``UnknownWorkerError``
  listing the workers that exist.
- ``rpc.rpc_sync``: waits on the main thread in a way Ctrl-C (the notebook's stop
  button) can interrupt, since ``Future.wait`` blocks in C++ where Python cannot
  deliver ``KeyboardInterrupt``; and names the worker in timeouts, in replies it
  could not pickle and in failures of workers whose process has ended (``failures``;
  the wait itself: ``waiting``). An
  interrupted or timed-out call is stopped on its worker too, nested calls included.
- ``rpc.rpc_async``: returns a ``NamedFuture`` (``futures``), whose ``wait`` does the same.
- ``remote``: sends a Python function as a ``Stoppable`` too (its output reaches the
  driver, see ``output``).
- ``remote`` and ``PyRRef.to_here``: the same named failures; ``to_here`` on the main
  thread of a Jupyter kernel can be interrupted outside an autograd context and a
  profiler, after at most ``DIRECT_FETCH`` s (the waiting stops; the function that built
  the value is not stopped). Both tell the RRef ledger if it tracks.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable

import torch.distributed.rpc as rpc

from .._compat import torch_compat
from .._compat.rpc_sync_code import rpc_sync_invoking
from .._compat.torch_compat import UNSET_RPC_TIMEOUT, RPCExecMode
from ..errors import SerializationError, UnknownWorkerError, WorkerDiedError
from ..recording import functions, pending, rref_ledger
from ..recording.pending import PENDING
from ..wire import held_instances, remote_errors
from ..wire.definitions import REGISTRY
from . import caller_half, destinations, interrupts, output, stopping
from .breakpoints import REMOTES, after_pause, failed_on, noting, stepped_through
from .failures import label, raise_named, stopped, worker_fate
from .futures import RAISE, NamedFuture, collect_all
from .waiting import in_background
from .waiting import wait as _wait

_torch_to_worker_info = torch_compat.to_worker_info
_torch_to_here = torch_compat.to_here

# How long ``to_here`` on a kernel's main thread waits for its value itself (seconds) before
# it waits on a helper thread, whose wait the stop button ends: most values come well
# within it, and the hand-off to a helper and back cost a small fetch about 15%.
DIRECT_FETCH = 0.5
_KERNEL = False  # this process is a Jupyter kernel (``_in_a_kernel``), once found to be


def install() -> None:
    """Put the wrappers in place (idempotent)."""
    torch_compat.patch(torch_compat.TO_WORKER_INFO, _to_worker_info)
    torch_compat.patch(torch_compat.RPC_SYNC, rpc_sync)
    torch_compat.patch(torch_compat.RPC_ASYNC, rpc_async)
    torch_compat.patch(torch_compat.REMOTE, remote)
    torch_compat.patch(torch_compat.RREF_TO_HERE, to_here)
    torch_compat.patch(torch_compat.COLLECT_ALL, collect_all)


def _to_worker_info(to):
    try:
        return _torch_to_worker_info(to)
    except RuntimeError as e:
        if "could not find destination" not in str(e):
            raise
        fate = worker_fate(to) if isinstance(to, str) else None
        if fate:  # a worker that was lost and dropped from the group
            raise WorkerDiedError(
                f"worker {to!r} {fate}; the other workers keep running. Start a new "
                f"cluster (%rpc_shutdown, then %rpc_init) to get {to!r} back"
            ) from e
        known = sorted(info.name for info in torch_compat.current_agent().get_worker_infos())
        which = f"named {to!r}" if isinstance(to, str) else f"with id {to!r}"
        # torch's own words kept: code and logs that look for them still find them
        msg = f"no worker {which} in this RPC group (torch said: {e}); the workers are: {', '.join(known)}"
        raise UnknownWorkerError(msg) from e


class _Done:
    """A waited-for call's value as torch's ``rpc_sync`` takes a future: ``wait()`` gives it."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class _Failed:
    """A waited-for call's error as torch's ``rpc_sync`` takes a future: ``wait()`` raises
    it from C (``futures.RAISE``), so that no frame of nbrpc's is under it."""

    __slots__ = ("wait",)

    def __init__(self, error: BaseException):
        self.wait = functools.partial(RAISE, error.with_traceback(None))


def _waited_call(to, func, mode, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT) -> _Done | _Failed:
    """What ``rpc_sync`` (torch's own code) calls for its ``_invoke_rpc``: the call made
    and waited for by ``_call_and_wait``, its outcome for torch's ``fut.wait()``, so that
    an error's traceback lists torch's frames where a script's does, none of nbrpc's."""
    try:
        return _Done(_call_and_wait(to, func, args, kwargs, timeout))
    except BaseException as e:
        return _Failed(e)


# ``torch.distributed.rpc.rpc_sync``, interruptible (stopping the call on the worker too)
# and with named failures: torch's own, with ``_waited_call`` for its ``_invoke_rpc``.
rpc_sync = rpc_sync_invoking(_waited_call)


def _call_and_wait(to, func, args, kwargs, timeout: float):
    """``rpc_sync``'s call, waited for interruptibly; its value, or its error as named."""
    destinations.require_callable(func)
    record = caller_half.record("rpc_sync", to, func)
    fut, sent = _send(_SYNC, to, func, args, kwargs, timeout, interrupts.sent_as(func), record, replies=True)
    call_id = None if sent is None else sent.call_id
    what = functions.named(func, args)  # an RRef proxy's call: by its method
    key, served = PENDING.calling(to, what, call_id, "rpc_sync"), interrupts.calling_from_here(to, call_id)
    try:
        _wait(fut, to, served)
        value = fut.wait()
    except RuntimeError as e:
        if stepped_through(e, to, call_id):  # a person stepped through it: no timeout
            value = after_pause(to, call_id)
        else:
            stop = stopping.stop_on_timeout(e, to, call_id)
            note = noting(record.answered, to, call_id)
            raise_named(e, to, label("rpc_sync", to, what), timeout, note, key, stop)
    except KeyboardInterrupt as e:
        record.failed(e)
        raise stopped(to, label("rpc_sync", to, what), call_id, key) from None
    except Exception as e:  # a remote exception of its own class (see remote_errors)
        remote_errors.tidy(e)
        record.answered(e)
        failed_on(e, to, call_id)
        raise
    finally:
        PENDING.answered(key)
        interrupts.called(served, call_id)
    record.answered()
    return value


@torch_compat.require_initialized
def rpc_async(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """``torch.distributed.rpc.rpc_async``, returning a ``NamedFuture``."""
    destinations.require_callable(func)
    record = caller_half.record("rpc_async", to, func)
    fut, sent = _send(_ASYNC, to, func, args, kwargs, timeout, interrupts.sent_as(func), record, replies=True)
    call_id = None if sent is None else sent.call_id
    what = functions.named(func, args)  # an RRef proxy's call: by its method
    # Found now: the call outlives this frame (see ``Pending.calling``); from torch's check up.
    key = PENDING.calling(to, what, call_id, "rpc_async", site=pending.call_site(2))
    named = NamedFuture(fut, (to, what, timeout, call_id), record, key)
    if hasattr(torch_compat.call_thread_state, "future_list"):  # inside torch's _wait_all()
        torch_compat.call_thread_state.future_list.append(named)
    return named


def remote(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """``torch.distributed.rpc.remote`` with named failures, in the RRef ledger. A Python
    function goes as a ``Stoppable``, so that what it writes is sent to the driver before
    the owner confirms the RRef; no reply is pickled (the value stays with its owner):
    a recorded ``remote``'s reply is the owner's ack of the RRef."""
    record = caller_half.record("remote", to, func)
    # In flight from before it is sent: what runs between a remote and the to_here after
    # it delays the fetch (see ``Pending.remote_sending``).
    carrier = interrupts.sent_as(func)
    call_id = interrupts.new_call_id() if carrier is not None else None
    site = pending.call_site(2)  # for the calls in flight and the RRef ledger
    what = functions.named(func, args)  # an RRef proxy's call: by its method
    key = PENDING.remote_sending(to, what, call_id, site)
    try:
        rref, _ = _send(destinations.remote_to, to, func, args, kwargs, timeout, carrier, record, replies=False,
                        call_id=call_id)
    except RuntimeError as e:
        PENDING.answered(key)
        raise_named(e, to, label("remote", to, what), timeout, record.named)
    except BaseException:
        PENDING.answered(key)
        raise
    PENDING.remote_made(key, rref)
    if call_id is not None:  # a to_here that raises its function's error names it (%debug)
        REMOTES.made(rref, call_id)
    record.made_rref(rref)
    if rref_ledger.is_tracking():
        rref_ledger.created(rref, to, site)
    return rref


def to_here(rref, timeout: float = UNSET_RPC_TIMEOUT):
    """``PyRRef.to_here`` with named failures; on the main thread it can be interrupted.
    What it raises lists torch's frames under the caller's, as a script's, none of nbrpc's."""
    try:
        return _named_to_here(rref, timeout)
    except BaseException as e:
        # A bare raise adds no entry for this frame: the caller's comes next.
        e.__traceback__ = remote_errors.without_our_frames(e.__traceback__)
        raise


def _named_to_here(rref, timeout: float):
    if rref.is_owner() or not torch_compat.has_agent():  # after shutdown: torch's own error
        return _torch_to_here(rref, timeout)
    owner = rref.owner_name()
    record = caller_half.record("to_here", owner, rref=rref)
    key, remote_key = PENDING.fetching(owner, rref)
    try:
        # Where no stop button ends the wait (a script), fetched once, as torch does.
        if _in_a_kernel() and threading.get_ident() == threading.main_thread().ident and not _this_threads():
            value = _fetch_interruptibly(rref, timeout, record, owner)
        else:
            value = _fetch(rref, timeout, record)
    except RuntimeError as e:
        note = noting(record.answered, owner, REMOTES.call_of(rref))
        raise_named(e, owner, f"to_here() of an RRef owned by {owner!r}", timeout, note, key)
    except Exception as e:  # a remote exception of its own class (see remote_errors)
        remote_errors.tidy(e)
        failed_on(e, owner, REMOTES.call_of(rref))
        raise
    except KeyboardInterrupt:
        record.failed(KeyboardInterrupt("interrupted"))
        raise KeyboardInterrupt(
            f"to_here() of an RRef owned by {owner!r} was interrupted; only the waiting "
            f"stopped (the fetch ends in the background){PENDING.explained(key)}") from None
    finally:
        PENDING.answered(key)
    if remote_key is not None:  # its function ran: no longer in flight
        PENDING.fetched(remote_key)
    record.answered()
    if rref_ledger.is_tracking():
        rref_ledger.fetched(rref)
    return value


def _this_threads() -> bool:
    """True inside ``dist_autograd.context()`` or a profiler on this thread. torch's
    ``to_here`` records its reply in this thread's context (a send and a recv function)
    and its event in this thread's profile: fetched on a helper thread, the value came
    back a leaf (``dist_autograd.backward`` waited for good) and the profile lacked it.
    torch's context count first spares the usual case a C++ exception (about 20 us)."""
    return torch_compat.context_id_or_none() is not None or torch_compat.profiler_enabled()


def _fetch_interruptibly(rref, timeout: float, record: caller_half.Record | caller_half.Unrecorded, owner: str):
    """``to_here`` on the main thread of a Jupyter kernel: fetched here for up to
    ``DIRECT_FETCH`` s (a stop takes effect once they are over), then again on a helper
    thread, whose wait the stop button ends at once. Sent twice, the first reply is dropped
    unread, RRefs in it left forked (torch's graceful shutdown waits on them for good): so
    only where a stop button ends the wait (``to_here`` asks ``_in_a_kernel`` first)."""
    limit = rpc.get_rpc_timeout() if timeout == UNSET_RPC_TIMEOUT else timeout  # 0: none
    if 0 < limit <= DIRECT_FETCH:
        return _fetch(rref, timeout, record)
    began = time.monotonic()
    try:
        return _fetch(rref, DIRECT_FETCH, record)
    except RuntimeError as e:
        if not stopping.timed_out(e):
            raise
    rest = 0 if limit == 0 else max(limit - (time.monotonic() - began), 1e-3)
    return in_background(lambda: _fetch(rref, rest, record), owner)


def _in_a_kernel() -> bool:
    """Whether this process is a Jupyter kernel: asked before each ``to_here``'s fetch, so
    a kernel's answer is kept (a process that became one stays one)."""
    global _KERNEL
    if not _KERNEL:
        app = sys.modules.get("ipykernel.kernelapp")  # imported by a kernel only, never here
        _KERNEL = app is not None and app.IPKernelApp.initialized()
    return _KERNEL


def _fetch(rref, timeout: float, record: caller_half.Record | caller_half.Unrecorded):
    """torch's ``to_here``; a recorded one counts the reply's bytes as it is unpickled. A
    value whose class the owner sent by identity, where this process lacks it, is fetched
    again in full, by a call (``c_pickling.fetched_message``)."""
    try:
        if record is caller_half.UNRECORDED:
            return _torch_to_here(rref, timeout)
        record.fetching(True)
        try:
            return _torch_to_here(rref, timeout)
        finally:
            record.fetching(False)
    except held_instances.NotHeld:
        return _call_and_wait(rref.owner(), _local_value, (rref,), None, timeout)


def _local_value(rref):
    """On an RRef's owner: its value, as a reply to the caller (its classes in full where
    the caller lacks them)."""
    return rref.local_value()


# How ``_send`` sends an ``rpc_sync``'s and an ``rpc_async``'s call (a ``remote``'s: ``destinations.remote_to``).
_SYNC = functools.partial(destinations.invoke_to, mode=RPCExecMode.SYNC)
_ASYNC = functools.partial(destinations.invoke_to, mode=RPCExecMode.ASYNC)


def _send(send: Callable, to, func, args, kwargs, timeout: float, carrier: type | None,
          record: caller_half.Record | caller_half.Unrecorded, replies: bool, call_id: str | None = None):
    """``send(to, f, args, kwargs, timeout)`` makes the call with ``f`` for ``func``: a
    Python function goes in its ``carrier`` (``interrupts.sent_as``: a ``Stoppable``, an
    ``@async_execution`` one an ``Awaited``) with a new call id (or ``call_id``, given only
    for such a function), so that an interrupt can stop it (a recorded call's carries the
    record's id, and whether its reply is pickled: ``replies``). Returns what ``send``
    returned and the carrier sent (None: the function went bare and cannot be stopped);
    the record learns what was sent, and a failure to send."""
    output.before_call()
    try:
        if carrier is None:
            return send(to, func, args, kwargs, timeout), None
        trace = None
        if carrier is interrupts.Stoppable:
            trace = record.trace(replies)
        call_id = call_id or interrupts.new_call_id()
        # A reply takes a class its caller made home by identity (``receivers.replying``).
        stoppable = carrier((func, call_id, trace, REGISTRY.origin) if replies else (func, call_id, trace))
        try:
            return send(to, stoppable, args, kwargs, timeout), stoppable
        except SerializationError:
            # Sent bare, the error names the function or argument that does not pickle.
            return send(to, func, args, kwargs, timeout), None
    except BaseException as e:
        record.failed(e)
        raise
    finally:
        record.sent(func, args)
