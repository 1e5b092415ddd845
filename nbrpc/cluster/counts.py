"""Busy RPC threads and owned RRefs of each member, from torch's debug info (the status table's columns)."""

from __future__ import annotations

import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ..group import membership

NONE = {"busy": None, "owned_rrefs": None}


def own() -> dict:
    """This member's counts; none before it has joined."""
    return member_counts(local=True) if membership.is_member() else dict(NONE)


def of_workers(names: list[str]) -> dict[str, dict]:
    """Each named worker's counts, asked over RPC at once; none for one that does not answer."""
    futures = {name: rpc.rpc_async(name, member_counts, timeout=5) for name in names}
    out = {}
    for name, future in futures.items():
        try:
            out[name] = future.wait()
        except (RuntimeError, TimeoutError):
            out[name] = dict(NONE)
    return out


def member_counts(local: bool = False) -> dict:
    """Busy RPC threads and owned RRefs of this member, from torch's debug info."""
    info = torch_compat.debug_info()
    busy = int(info["agent.thread_pool_size"]) - int(info["agent.num_idle_threads"])
    # Asked over RPC, one busy thread is the one answering.
    return {"busy": busy - (0 if local else 1), "owned_rrefs": int(info["num_owner_rrefs"])}
