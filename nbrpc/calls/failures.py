"""A failed call's error as nbrpc names it: the call, its worker, what became of it.

- ``WORKER_FATES`` / ``worker_fate``: why a worker is gone (the running cluster tells).
- ``named``: a clearer error for a dead worker, a timeout or a reply that could not be
  pickled; the remote exception itself where torch could not keep its class.
- ``raise_named``: raise that error, chained to torch's.
- ``stopped``: the error for an interrupted call, after its worker was asked to stop it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn

import torch.distributed.rpc as rpc

from .._compat.torch_compat import UNSET_RPC_TIMEOUT
from .._util import Hooks
from ..errors import RpcTimeoutError, SerializationError, WorkerDiedError
from ..recording import pending
from ..recording.functions import destination_name
from ..recording.pending import PENDING
from ..wire import remote_errors
from . import stopping

# ``fate(name)``: why worker ``name`` is gone, or None; the running cluster registers one.
WORKER_FATES = Hooks()
# What torch's transport says when a worker's connection drops: closed (its process ended),
# reset (it ended with data unread: a scheduler's kill mid-call) or broken on a write.
CONNECTION_LOST = ("EOF", "ECONNRESET", "EPIPE")


def worker_fate(name: str) -> str | None:
    """Why worker ``name`` is gone, or None while it runs (or no cluster knows it)."""
    return WORKER_FATES.first(name)


def raise_named(error: RuntimeError, to, label: str, timeout: float, note: Callable = None, key=None,
                stop: str | None = None) -> NoReturn:
    """Raise ``error`` as nbrpc names it (``named``; itself when nothing more is known),
    chained to torch's; ``note(named)`` tells the call's record first."""
    found = remote_errors.tidy(named(error, to, label, timeout, key, stop))
    if note is not None:
        note(found)
    if found is error:
        raise error
    # Chained to torch's error as it came from torch's C++ (its frame here is nbrpc's).
    raise found from error.with_traceback(None)


def label(how: str, to, func) -> str:
    name = destination_name(to)
    return f"{how}({name!r}, {pending.function_name(func)})"


def stopped(to, label: str, call_id: str | None, key: str | None = None) -> KeyboardInterrupt:
    """The error for an interrupted call, after asking its worker to stop it."""
    # The diagnosis first: the stop changes what the callee does.
    return stopping.stopped(to, label, call_id, PENDING.explained(key))


def named(error: RuntimeError, to, label: str, timeout: float, key: str | None = None, stop=None) -> Exception:
    """Return a clearer error for a dead worker or a timeout, the remote exception
    itself where it was of a class torch could not keep, else ``error`` itself;
    ``label`` names the call, ``stop`` what became of it after a timeout's stop."""
    original = remote_errors.original(error)
    if original is not None:
        return original
    name = destination_name(to)
    fate = worker_fate(name)
    text = str(error)
    if not fate and any(sign in text for sign in CONNECTION_LOST):
        # The worker's process ended (killed, or ended by its scheduler): torch saw its
        # connection drop a moment before the launcher's watch on the process did.
        deadline = time.monotonic() + 2.0
        while not fate and time.monotonic() < deadline:
            time.sleep(0.05)
            fate = worker_fate(name)
    if fate:
        msg = (
            f"{label} failed: worker {name!r} {fate}. Its state is "
            "lost; the other workers keep running. Start a new cluster (%rpc_shutdown, "
            f"then %rpc_init) to get {name!r} back{PENDING.explained(key)}. Torch said: {error}"
        )
        return WorkerDiedError(msg)
    if text.startswith(f"{SerializationError.__name__}: "):
        # The worker could not pickle its reply; torch hands back only the text,
        # followed by its C++ stack.
        reason = text.split("\n\nAt:", 1)[0].split(": ", 1)[1]
        msg = f"{label} ran on {name!r} but its reply could not be sent: {reason}"
        return SerializationError(msg)
    if "RPC ran for more than set timeout" in text:
        seconds = timeout if timeout != UNSET_RPC_TIMEOUT else rpc.get_rpc_timeout()
        torch_said = text.split("\n\nAt:", 1)[0].strip()
        msg = (
            f"{label} got no answer within {seconds:g} s ({stopping.outcome_text(stop, name)}). "
            "Pass timeout=SECONDS to the call, or start the cluster "
            f"with a longer default (%rpc_init --timeout SECONDS){PENDING.explained(key)}. Torch said: {torch_said}"
        )
        return RpcTimeoutError(msg)
    return error
