"""One function run in every member of the group at once: nbrpc's own calls."""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ..errors import NoClusterError
from ..recording import recorder


def ask_members(func: Callable, args: tuple = (), timeout: float = 5.0,
                here: Callable | None = None) -> list:
    """``func(*args)`` in every member of the group, in parallel: this process first (or
    ``here()`` instead), then the others over RPC; a member that cannot answer within
    ``timeout`` (gone, stuck) is left out."""
    if not torch_compat.has_agent():
        raise NoClusterError("no RPC group in this process; start one with %rpc_init or nbrpc.start()")
    agent = torch_compat.current_agent()
    me = agent.get_worker_info()
    with recorder.quiet():  # nbrpc's own calls are not the user's to see
        futures = [rpc.rpc_async(w, func, args=args, timeout=timeout)
                   for w in agent.get_worker_infos() if w.id != me.id]
    answers = [here() if here else func(*args)]
    for fut in futures:
        try:
            answers.append(fut.wait())
        except (RuntimeError, TimeoutError):
            pass
    return answers
