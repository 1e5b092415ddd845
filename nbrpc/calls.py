"""Make torch's blocking RPC calls behave in an interactive session.

Two wrappers, installed in every member by ``group.join``:

- ``api._to_worker_info`` (every ``rpc_sync``, ``rpc_async`` and ``remote`` resolves
  its destination through it): an unknown name raises ``UnknownWorkerError``
  listing the workers that exist.
- ``rpc.rpc_sync``: waits on the main thread in a way Ctrl-C (the notebook's stop
  button) can interrupt, since ``Future.wait`` blocks in C++ where Python cannot
  deliver ``KeyboardInterrupt``; and names the worker in timeouts, in replies it
  could not pickle and in failures of workers whose process has ended.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch.distributed.rpc as rpc
from torch.distributed.rpc import api
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT
from torch.distributed.rpc.internal import RPCExecMode

from . import remote_errors
from .errors import (
    NoClusterError,
    RpcTimeoutError,
    SerializationError,
    UnknownWorkerError,
    WorkerDiedError,
)

_torch_to_worker_info = api._to_worker_info
_torch_rpc_sync = api.rpc_sync

# How often a waiting rpc_sync asks whether its worker is still there.
FATE_POLL = 0.5
# Set by the driver's cluster: worker name -> why it is gone, or None if alive.
worker_fate: Callable[[str], str | None] = lambda name: None


def install() -> None:
    """Put the wrappers in place (idempotent)."""
    api._to_worker_info = _to_worker_info
    api.rpc_sync = rpc.rpc_sync = rpc_sync


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
        known = sorted(info.name for info in api._get_current_rpc_agent().get_worker_infos())
        which = f"named {to!r}" if isinstance(to, str) else f"with id {to!r}"
        msg = f"no worker {which} in this RPC group; the workers are: {', '.join(known)}"
        raise UnknownWorkerError(msg) from e


@api._require_initialized
def rpc_sync(to, func, args=None, kwargs=None, timeout: float = UNSET_RPC_TIMEOUT):
    """``torch.distributed.rpc.rpc_sync``, interruptible and with named failures."""
    fut = api._invoke_rpc(to, func, RPCExecMode.SYNC, args, kwargs, timeout)
    try:
        if not fut.done() and threading.current_thread() is threading.main_thread():
            done = threading.Event()
            fut.add_done_callback(lambda _: done.set())
            while not done.wait(FATE_POLL):
                # A worker whose link went silent never answers, and torch would
                # wait out the whole RPC timeout to say so.
                name = to if isinstance(to, str) else getattr(to, "name", None)
                if name is not None and worker_fate(name):
                    raise RuntimeError("no reply: the worker is gone")
        return fut.wait()
    except RuntimeError as e:
        named = _named(e, to, func, timeout)
        if named is e:
            raise
        raise named from e


def _named(error: RuntimeError, to, func, timeout: float) -> Exception:
    """Return a clearer error for a dead worker or a timeout, the remote exception
    itself where it was of a class torch could not keep, else ``error`` itself."""
    original = remote_errors.original(error)
    if original is not None:
        return original
    name = to if isinstance(to, str) else getattr(to, "name", str(to))
    what = getattr(func, "__qualname__", repr(func))
    fate = worker_fate(name)
    if fate:
        msg = (
            f"rpc_sync({name!r}, {what}) failed: worker {name!r} {fate}. Its state is "
            "lost; the other workers keep running. Start a new cluster (%rpc_shutdown, "
            f"then %rpc_init) to get {name!r} back. Torch said: {error}"
        )
        return WorkerDiedError(msg)
    text = str(error)
    if text.startswith(f"{SerializationError.__name__}: "):
        # The worker could not pickle its reply; torch hands back only the text,
        # followed by its C++ stack.
        reason = text.split("\n\nAt:", 1)[0].split(": ", 1)[1]
        msg = f"rpc_sync({name!r}, {what}) ran on {name!r} but its reply could not be sent: {reason}"
        return SerializationError(msg)
    if "RPC ran for more than set timeout" in text:
        seconds = timeout if timeout != UNSET_RPC_TIMEOUT else rpc.get_rpc_timeout()
        msg = (
            f"rpc_sync({name!r}, {what}) got no answer within {seconds:g} s (it may still "
            "be running there). Pass timeout=SECONDS to the call, or start the cluster "
            "with a longer default (%rpc_init --timeout SECONDS)."
        )
        return RpcTimeoutError(msg)
    return error


def ask_members(func: Callable, args: tuple = (), timeout: float = 5.0,
                here: Callable | None = None) -> list:
    """``func(*args)`` in every member of the group, in parallel: this process first (or
    ``here()`` instead), then the others over RPC; a member that cannot answer within
    ``timeout`` (gone, stuck) is left out."""
    if not api._is_current_rpc_agent_set():
        raise NoClusterError("no RPC group in this process; start one with %rpc_init or nbrpc.start()")
    agent = api._get_current_rpc_agent()
    me = agent.get_worker_info()
    futures = [rpc.rpc_async(w, func, args=args, timeout=timeout)
               for w in agent.get_worker_infos() if w.id != me.id]
    answers = [here() if here else func(*args)]
    for fut in futures:
        try:
            answers.append(fut.wait())
        except RuntimeError:
            pass
    return answers
