"""What ``rpc_async`` returns: ``NamedFuture``, and ``collect_all`` over such futures.

A callback (``then``, ``add_done_callback``) gets the call's outcome as torch gives it to
a script's callback: on a future torch's C++ completes once nbrpc's settling returned, whose
``wait()`` and ``value()`` raise in C. torch writes the frames of a callback's error into
its text ("At:", from where the error was raised up the stack), which so hold the user's
frames only, never nbrpc's.
"""

from __future__ import annotations

import copy
import functools

import torch

from .._compat import torch_compat
from .._compat.future_unwrap import set_unwrap
from ..recording.pending import PENDING
from ..wire import remote_errors
from . import agent_devices, caller_half, interrupts, stopping, waiting
from .breakpoints import after_pause, failed_on, noting, stepped_through
from .failures import label, named, raise_named, stopped
from .prompts import asked_for

_torch_collect_all = torch_compat.collect_all
_CFuture = torch_compat.CppFuture  # torch's C++ future, under torch.futures.Future's Python methods
_spent = (x for x in ())
next(_spent, None)
# Raises the exception it is given, from C (a spent generator's ``throw`` runs no frame):
# a view's ``unwrap``, so that its ``wait()`` raises with the caller's frame the last one.
RAISE = _spent.throw


class NamedFuture(torch.futures.Future):
    """What ``rpc_async`` returns: ``wait()`` names failures as ``rpc_sync`` does and,
    on the main thread, can be interrupted, which stops the call on its worker too; what
    it raises lists no frame under the caller's, as torch's future's C ``wait``.

    Its callbacks (``then``, ``add_done_callback``: C methods of its view, see the module)
    get the error ``wait`` names, raised from C; ``value()`` and ``torch.futures.wait_all``
    (see ``collect_all``) keep torch's errors; it has torch's future's devices (``agent_devices``).
    One is made and settled per call: it calls torch's C++ future directly, where
    ``torch.futures.Future`` adds only a Python layer, and names its call only on failure.
    """

    def __init__(self, fut: torch.futures.Future, call: tuple,
                 record: caller_half.Record | caller_half.Unrecorded | None = None, key: str | None = None):
        _CFuture.__init__(self, agent_devices.current())
        self._call = call  # (destination, function, timeout, call id)
        self._record = record or caller_half.UNRECORDED
        self._key = key  # in PENDING while in flight
        self._served = interrupts.calling_from_here(call[0], call[3])  # what made it, on this member
        self._stopping: torch.futures.Future | None = None  # the stop its timeout sent
        self._failure: BaseException | None = None  # set by _settle before it settles this future
        self.call = fut  # torch's own future of the call
        fut.add_done_callback(self._settle)

    # C methods of the view, so that no frame of nbrpc's is under a callback (a property's
    # has returned before the callback is added).
    then = property(lambda self: functools.partial(_CFuture.then, self._viewed()))
    add_done_callback = property(lambda self: functools.partial(_CFuture.add_done_callback, self._viewed()))

    def _viewed(self) -> torch.futures.Future:
        """The view callbacks go on, made when first asked for or as the call fails: most
        futures are only waited for, and a view costs each call a callback on the agent's
        thread. Made on ``call``, after ``_settle``; at once where the call is over."""
        view = self.__dict__.get("_view")
        if view is not None:
            return view
        # The view and, on failure, its error (``_outcome``, maybe on another thread, maybe
        # before ``then`` returns): whichever is stored second finds both and sets the raise
        # (each store and look is one step under the GIL; setting it twice is harmless).
        pair = {}
        view = _CFuture.then(self.call, functools.partial(self._outcome, pair))
        pair["view"] = view
        if len(pair) == 2:
            set_unwrap(view, RAISE)
        # Made on two threads at once, the first stored is everyone's (the other is dropped).
        return self.__dict__.setdefault("_view", view)

    def _settle(self, fut: torch.futures.Future) -> None:
        torch_compat.keep_thread_state()
        PENDING.answered(self._key)
        if self._served is not None:
            interrupts.called(self._served, self._call[3])
        try:
            value = fut.value()
        except Exception as e:
            if not asked_for(self._call[3]):  # a paused call is not stopped: see ``wait``
                self._stopping = stopping.stop_if_timed_out(e, self._call[0], self._call[3])
            # Only a look: ``wait`` raises the remote exception itself.
            self._record.answered(remote_errors.original(e, take=False) or e)
            self._failure = remote_errors.tidy(e).with_traceback(None)  # no one has it yet
            self._viewed()  # its error named before ``wait`` can take the remote exception
            self.set_exception(self._failure)
        else:
            self._record.answered()
            _CFuture.set_result(self, value)

    def _outcome(self, pair: dict, _settled):
        """The view's value: the call's, or its error as ``wait`` names it (without waiting
        for a stop's answer, nor for a person paused in a debugger), raised by the view.

        The error is not raised here, and the view's is a copy (``_own``): each raise
        writes its frames into the exception, and the caller's ``wait`` raises the same
        one, maybe at this moment on another thread."""
        if self._failure is None:
            try:
                return _CFuture.wait(self)
            except Exception:  # failed meanwhile on the agent's thread (a view made as the call
                pass  # ended): its error is ``_failure``
        error = _own(self._named_now(self._failure))
        pair["error"] = error
        if len(pair) == 2:
            set_unwrap(pair["view"], RAISE)
        return error

    def _named_now(self, error: Exception) -> BaseException:
        """``error`` as ``wait`` raises it, the stop's answer as far as it came."""
        to, func, timeout, call_id = self._call
        if type(error) is not RuntimeError:
            return error
        kept = remote_errors.original(error, take=False)  # left for ``wait`` to take
        if kept is not None:
            return kept
        stop = self._stopping
        outcome = None if stop is None else interrupts.stop_outcome(stop, 0) or stopping.ASKED
        found = remote_errors.tidy(named(error, to, label("rpc_async", to, func), timeout, self._key, outcome))
        noting(None, to, call_id)(found)
        return found

    def wait(self):
        to, func, timeout, call_id = self._call
        try:
            try:
                if not _CFuture.done(self):  # (an RRef proxy's type, asked before every call, is done)
                    waiting.wait(self, to, interrupts.served_here())
                return _CFuture.wait(self)
            except RuntimeError as e:
                if stepped_through(e, to, call_id):  # a person stepped through it: no timeout
                    return after_pause(to, call_id)
                raise_named(e, to, label("rpc_async", to, func), timeout, noting(None, to, call_id),
                            self._key, stopping.outcome(self._stopping))
            except KeyboardInterrupt:
                raise stopped(to, label("rpc_async", to, func), call_id, self._key) from None
            except Exception as e:  # a remote exception of its own class (see remote_errors)
                failed_on(e, to, call_id)
                raise
        except BaseException as e:
            # As from torch's future, whose wait is C: no frame under the caller's (a bare
            # raise adds no entry for this one, see ``remote_errors.without_our_frames``).
            e.__traceback__ = None
            raise


def _own(error: BaseException) -> BaseException:
    """A copy of ``error`` without its traceback, re-made from its ``args`` as pickling
    re-makes it, with its chain; ``error`` itself where its class cannot be re-made so."""
    try:
        made = copy.copy(error)
    except Exception:
        return error
    made.__cause__, made.__context__ = error.__cause__, error.__context__
    made.__suppress_context__ = error.__suppress_context__
    return made


def collect_all(futures):
    """torch's ``_collect_all`` (under ``torch.futures.wait_all`` and ``collect_all``),
    given each ``NamedFuture``'s own call instead.

    A ``NamedFuture`` that failed holds its error as a value for ``wait`` to raise
    (``set_exception`` does no more): torch's C++ future sees no error there, so
    ``wait_all`` would wait for every other call instead of raising the first
    failure at once. The collected futures are the calls', so their errors are torch's.
    """
    return _torch_collect_all([f.call if isinstance(f, NamedFuture) else f for f in futures])
