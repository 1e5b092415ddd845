"""Every patch of torch a member makes, in one place."""

from __future__ import annotations

from ..recording import futures, rref_ledger
from ..wire import serialization
from . import agent_devices, backward, breakpoints, wrappers


def install(track: bool = True) -> None:
    """nbrpc's pickler (remote errors' replies included), call wrappers, the backward that recordings
    watch, what follows the agent's devices, where each Future was made, and the RRef
    ledger's hooks when ``track``, and ``breakpoint()`` prompting in the calling cell.
    Before a member's agent starts (torch's C++ side looks some of these up once);
    idempotent."""
    serialization.install()
    wrappers.install()
    backward.install()
    agent_devices.install()
    rref_ledger.hook(track)
    futures.hook()
    breakpoints.install()
