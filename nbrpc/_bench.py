"""The one seam nbrpc's benchmarks use below the public API.

``benchmarks/`` drives nbrpc through ``nbrpc.start`` and torch's own functions. To
split nbrpc's cost into its layers it also switches a few of them on and off, and
only through this module, so that nbrpc's modules can move without breaking it.
Nothing in nbrpc imports it; it is not for users and may change with the layers.

- ``torch_rpc_sync``: torch's own ``rpc_sync``, under nbrpc's wrapper.
- ``recording(on)``: call recording in every member, as ``with nbrpc.trace():`` turns it
  on and off (without the trace's snapshot).
- ``rref_tracking(on)``: the driver's RRef tracking.
- ``set_inline_limit(limit)``: how many calls torch's RPC threads run themselves in the
  member it runs in (0: hand every call to a serving thread; None: the default).
- ``stoppable_sync(plain)``: an ``rpc_sync`` sent as nbrpc sends every call, served as
  nbrpc serves it, or (``plain``) run as a plain function on torch's RPC thread.
- ``sent_bytes(func, to)``: bytes of the pickle a small call of ``func`` sends.
- ``OUTPUT_SINKS``, ``mark_and_check()``: where the driver puts its workers' output; what
  a call that prints nothing pays for output.
- ``RpcPickler``, ``set_pickler(cls)``: nbrpc's RPC pickler, and torch's pickler slot.
- ``PENDING``: the bookkeeping of pending calls that ``nbrpc.waits()`` reads.
- ``template_process()``: the warm template's pid and seconds to ready, or None.
- ``KERNEL_NAME``, ``install_kernel(prefix)``: the kernel spec nbrpc installs, and its install.
- ``PARTS``, ``left_out(part)``: the parts of a call's path, and a context in which one
  of them is left out of this member's calls (``benchmarks/parts.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ._compat import torch_compat
from .calls import interrupts, output, serving, wrappers
from .calls.fanout import ask_members
from .launchers import template
from .recording import pending, recorder, rref_ledger
from .recording.pending import PENDING
from .shared_server.kernel import NAME as KERNEL_NAME
from .shared_server.kernel import install as install_kernel
from .wire import c_pickling
from .wire.cloudpickling import RpcPickler
from .wire.receivers import receivers

__all__ = ["KERNEL_NAME", "OUTPUT_SINKS", "PARTS", "PENDING", "RpcPickler", "install_kernel", "left_out",
           "mark_and_check", "recording", "rref_tracking", "sent_bytes", "set_inline_limit", "set_pickler",
           "stoppable_sync", "template_process", "torch_rpc_sync"]

torch_rpc_sync = torch_compat.rpc_sync
OUTPUT_SINKS = output.SINKS
SMALL_ARG = 1


def recording(on: bool) -> None:
    """Call recording on or off in every member."""
    ask_members(recorder.enable, (on,))


def rref_tracking(on: bool) -> None:
    """The RRef tracking of this member on or off."""
    rref_ledger.hook(on)


def set_inline_limit(limit: int | None) -> None:
    """How many calls torch's RPC threads may run themselves in this member."""
    serving.pool.inline_limit = limit


class _InlineStoppable(interrupts.Carrier):
    """A ``Stoppable`` that torch runs as a plain function on its own RPC thread, always
    (without ``serving``'s limit: the reference of the hand-off rows)."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        torch_compat.keep_thread_state()
        return self.serve(*args, **kwargs)


def stoppable_sync(plain: bool) -> Callable:
    """An ``rpc_sync(to, func, args)`` that sends ``func`` with a call id, as nbrpc's
    wrapper does, but waits as torch does."""
    kind = _InlineStoppable if plain else interrupts.Stoppable

    def call(to, func, args=()):
        stoppable = kind((func, interrupts.new_call_id(), None))
        return torch_compat.invoke_rpc(to, stoppable, torch_compat.RPCExecMode.SYNC, args, None,
                                       torch_compat.UNSET_RPC_TIMEOUT).wait()

    return call


def sent_bytes(func: Callable, to: str) -> int:
    """Bytes of the pickle an ``rpc_sync`` of ``func`` to ``to`` sends (no tensors)."""
    udf = torch_compat.PythonUDF(interrupts.Stoppable((func, interrupts.new_call_id(), None)), (SMALL_ARG,), {})
    receivers.begin(to)
    try:
        payload, _tensors = torch_compat.pickle_message(udf)
    finally:
        receivers.end()
    return len(payload)


def mark_and_check() -> None:
    """What a call that prints nothing pays for output: the thread's mark and an empty
    outbox's check."""
    output.begin()
    output.end()


def set_pickler(cls: type) -> None:
    """The pickler torch's RPC uses in this process from now on."""
    torch_compat.set_pickler_class(cls)


def template_process() -> tuple[int, float] | None:
    """The warm template's pid and the seconds it took to be ready, if there is one."""
    current = template.current()
    return None if current is None else (current.pid, current.ready_after or 0.0)


class _NoCalls:
    """The calls-in-flight table left out: nothing noted, nothing explained."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def fetching(self, *args) -> tuple[None, None]:  # (a fetch's key and its remote's)
        return None, None


def _torch_own(*points) -> list[tuple]:
    return [(owner, name, torch_compat._originals[(owner, name)]) for point in points for owner, name in point]


# Each part of a call's path, as the (owner, name, stand-in) swaps that leave it out.
PARTS = {
    "the caller's wrappers (torch's own functions)": lambda: _torch_own(
        torch_compat.RPC_SYNC, torch_compat.RPC_ASYNC, torch_compat.REMOTE, torch_compat.RREF_TO_HERE),
    "remote's wrapper (torch's own remote)": lambda: _torch_own(torch_compat.REMOTE),
    "to_here's wrapper (torch's own to_here)": lambda: _torch_own(torch_compat.RREF_TO_HERE),
    "the stop carrier (Stoppable, served on the worker)": lambda: [(interrupts, "sent_as", lambda func: None)],
    "pickling a call's arguments in C (the kept pickler instead)": lambda: [(c_pickling, "WALK_LIMIT", 0)],
    "the named future of rpc_async (NamedFuture)": lambda: [
        (wrappers, "NamedFuture", lambda fut, call, record=None, key=None: fut)],
    "the interruptible wait of rpc_sync": lambda: [(wrappers, "_wait", lambda fut, to, served=None: None)],
    "the calls in flight (nbrpc.waits)": lambda: [(wrappers, "PENDING", _NoCalls())],
    "the call site of each call": lambda: [(pending, "call_site", lambda depth=2: None)],
    "the RRef ledger's tracking": lambda: [(rref_ledger, "is_tracking", lambda: False)],
}


@contextlib.contextmanager
def left_out(part: str):
    """Within, this member's calls go without ``part`` (one of ``PARTS``): a stand-in that
    does nothing takes its place, for a measurement only."""
    swaps = PARTS[part]()
    kept = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, value in swaps:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in kept:
            setattr(owner, name, value)
