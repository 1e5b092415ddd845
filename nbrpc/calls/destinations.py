"""Where a call goes, told to the pickler: notebook code a receiver holds goes by digest.

``remote_to`` and ``invoke_to`` are torch's ``remote`` and ``_invoke_rpc`` for the call
wrappers, with the destination set for the pickler while the call is pickled
(``definitions.receivers``); once the destination answered a call that carried a code in
full, it holds that code (``_acknowledging``). A call's carrier (``cloudpickling.CARRIERS``)
goes to torch's C++ call directly while no profiler runs (``_send``).
"""

from __future__ import annotations

from collections.abc import Callable

from .._compat import torch_compat
from .._compat.torch_compat import RPCExecMode
from ..recording.functions import destination_name
from ..wire.cloudpickling import CARRIERS
from ..wire.receivers import receivers
from . import scripted

_torch_remote = torch_compat.remote
# A carrier class -> torch's branch for its calls (``torch_compat.call_kind``): the same for
# every call it carries, so asked once, not on each call.
_CARRIED: dict[type, tuple] = {}


def remote_to(to, func, args, kwargs, timeout: float):
    """torch's ``remote``, telling the pickler where the call goes."""
    receivers.begin(destination_name(to))
    try:
        rref = _send(to, func, args, kwargs, timeout, remote=True)
    finally:
        fresh = receivers.end()
    if fresh:
        torch_compat.creation_future(rref).add_done_callback(_acknowledging(to, fresh))
    return rref


def _send(to, func, args, kwargs, timeout: float, mode: RPCExecMode | None = None, remote: bool = False):
    """torch's ``_invoke_rpc`` with ``mode`` (``remote``: torch's ``remote``); a carrier
    goes without torch's profiling context and lookups unless a profiler runs
    (``torch_compat.send_python_call``, which hands any other kind of callable to torch)."""
    carrier = type(func)
    if carrier in CARRIERS:
        kind = _CARRIED.get(carrier) or _CARRIED.setdefault(carrier, torch_compat.call_kind(func))
        return torch_compat.send_python_call(to, func, args, kwargs, timeout, RPCExecMode.REMOTE if remote else mode,
                                             kind)
    func = scripted.as_sent(to, func, timeout)  # a TorchScript function compiled again: its stand-in
    if remote:
        return _torch_remote(to, func, args, kwargs, timeout)
    return torch_compat.invoke_rpc(to, func, mode, args, kwargs, timeout)


def require_callable(func) -> None:
    """torch's first check in ``rpc_sync`` and ``rpc_async`` (its ``_invoke_rpc``), made
    by their wrappers: the carrier that goes in ``func``'s place is callable whatever it is."""
    if not callable(func):
        raise TypeError(f"function should be callable; got {type(func).__name__} {func!r:.80}: pass the "
                        "function itself, as in rpc.rpc_sync(to, f, args=(x,)), not what it returned")


def _acknowledging(to, fresh: list[bytes]) -> Callable:
    """A done-callback: once ``to`` answered, it holds the codes the call carried."""
    name = destination_name(to)

    def acknowledge(fut) -> None:
        try:
            fut.value()
        except Exception:
            return  # maybe never unpickled: keep sending the code in full
        receivers.acknowledged(name, fresh)

    return acknowledge


def invoke_to(to, func, args, kwargs, timeout: float, mode: RPCExecMode):
    """torch's ``_invoke_rpc``, telling the pickler where the call goes."""
    receivers.begin(destination_name(to))
    try:
        fut = _send(to, func, args, kwargs, timeout, mode=mode)
    finally:
        fresh = receivers.end()
    if fresh:
        fut.add_done_callback(_acknowledging(to, fresh))
    return fut
