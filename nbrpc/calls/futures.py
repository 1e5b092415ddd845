"""What ``rpc_async`` returns: ``NamedFuture``, and ``collect_all`` over such futures."""

from __future__ import annotations

import torch

from .._compat import torch_compat
from ..recording.pending import PENDING
from ..wire import remote_errors
from . import agent_devices, caller_half, interrupts, stopping, waiting
from .breakpoints import after_pause, failed_on, noting, stepped_through
from .failures import label, raise_named, stopped
from .prompts import asked_for

_torch_collect_all = torch_compat.collect_all
_CFuture = torch_compat.CppFuture  # torch's C++ future, under torch.futures.Future's Python methods


class NamedFuture(torch.futures.Future):
    """What ``rpc_async`` returns: ``wait()`` names failures as ``rpc_sync`` does and,
    on the main thread, can be interrupted, which stops the call on its worker too.

    Futures made from it (``then``), ``value()`` and ``torch.futures.wait_all`` (see
    ``collect_all``) keep torch's errors; it has torch's future's devices (``agent_devices``).
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
        self.call = fut  # torch's own future of the call
        fut.add_done_callback(self._settle)

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
            self.set_exception(remote_errors.tidy(e))
        else:
            self._record.answered()
            _CFuture.set_result(self, value)

    def wait(self):
        to, func, timeout, call_id = self._call
        try:
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


def collect_all(futures):
    """torch's ``_collect_all`` (under ``torch.futures.wait_all`` and ``collect_all``),
    given each ``NamedFuture``'s own call instead.

    A ``NamedFuture`` that failed holds its error as a value for ``wait`` to raise
    (``set_exception`` does no more): torch's C++ future sees no error there, so
    ``wait_all`` would wait for every other call instead of raising the first
    failure at once. The collected futures are the calls', so their errors are torch's.
    """
    return _torch_collect_all([f.call if isinstance(f, NamedFuture) else f for f in futures])
