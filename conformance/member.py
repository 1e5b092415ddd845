"""What makes a process a member of an nbrpc group, in one place.

``become_member`` does, in this process, what ``nbrpc.group.join`` does around the start
of a member's RPC agent: the steps before it now, the steps after it returned as a
function to call once the agent is up. Only these nbrpc calls; the rest of the
harness never touches nbrpc.
"""

from __future__ import annotations

from collections.abc import Callable


def become_member(key: bytes, track: bool = True, trace: bool = False) -> Callable[[], None]:
    """Put nbrpc's patches of torch in place as a member does before it joins (``key``
    signs its pickles, the same in every process of the group); return the steps a
    member takes once its agent started."""
    from nbrpc import rref_ledger, serialization, torch_compat, tracing
    from nbrpc._util import silence_torch_noise

    serialization.set_key(key)
    torch_compat.install(track)
    silence_torch_noise()

    def joined() -> None:
        rref_ledger.reset()
        tracing.install(trace)

    return joined
