"""What makes a process a member of an nbrpc group, in one place.

``become_member`` does, in this process, what ``nbrpc.group.membership.join`` does around
the start of a member's RPC agent (its own ``before_agent`` and ``after_agent``): the
steps before it now, the steps after it returned as a function to call once the agent
is up, and the group's signing key. Only these nbrpc calls; the rest of the harness
never touches nbrpc.
"""

from __future__ import annotations

from collections.abc import Callable


def become_member(key: bytes, track: bool = True, trace: bool = False) -> Callable[[], None]:
    """Put nbrpc's patches of torch in place as a member does before it joins (``key``
    signs its pickles, the same in every process of the group); return the steps a
    member takes once its agent started."""
    from nbrpc.group import membership
    from nbrpc.wire import serialization

    serialization.set_key(key)
    membership.before_agent(track)
    return lambda: membership.after_agent(trace)
