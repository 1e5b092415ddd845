"""One clock for the whole group: the driver's ``time.monotonic()``.

Members on the driver's machine read the same ``CLOCK_MONOTONIC`` (same boot id):
their offset is 0, exactly. A member on another machine has its own; ``estimate``
measures its offset from the driver with round trips (the driver's clock before and
after, the member's in between), keeps the sample with the lowest delay and bounds
its error by half of that round trip: ``driver = member + offset``, within ``bound``.

``set_skew`` adds a fixed amount to this process's clock and marks it as another
machine's, so tests can check the estimate against a known offset on one host (a
worker sets the skew its environment asks for as it starts: ``settings.clock_skew``).
"""

from __future__ import annotations

import socket
import time

import torch.distributed.rpc as rpc

from .._compat import torch_compat

ROUNDS = 16

_skew = 0.0

# This process's clock (seconds): ``time.monotonic`` itself, or shifted by the test
# skew. Rebound by ``set_skew`` rather than adding 0.0 on every read: call recording
# reads it several times per call.
now = time.monotonic


def _skewed() -> float:
    return time.monotonic() + _skew


def set_skew(seconds: float = 0.0) -> None:
    """Shift this process's clock by ``seconds`` (0: its own clock again)."""
    global _skew, now
    _skew = float(seconds)
    now = _skewed if _skew else time.monotonic


def _member_now() -> float:
    """``now()`` as an RPC target: a function torch pickles by name, that reads the
    member's own clock as it is when the call runs."""
    return now()


def clock_id() -> str:
    """Equal in two processes exactly when they read the same monotonic clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            machine = f.read().strip()
    except OSError:
        machine = socket.gethostname()
    return f"{machine}+{_skew!r}" if _skew else machine


def _ask(name: str, timeout: float) -> float:
    # torch's own call: no nbrpc wrapper (nothing to record, nothing to interrupt).
    return torch_compat.invoke_rpc(name, _member_now, torch_compat.RPCExecMode.SYNC, (), None, timeout).wait()


def estimate(name: str, rounds: int = ROUNDS, timeout: float = 5.0) -> tuple[float, float]:
    """``(offset, bound)`` of member ``name``'s clock: ``driver = member + offset``, to
    within ``bound`` seconds (half the fastest round trip)."""
    _ask(name, timeout)  # the first call may open the connection
    best: tuple[float, float] | None = None
    for _ in range(rounds):
        before = now()
        theirs = _ask(name, timeout)
        after = now()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) / 2 - theirs)
    delay, offset = best
    return offset, delay / 2


def estimate_all(members: dict[str, str], timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """``(offset, bound)`` per member name, given each member's ``clock_id``: members
    on this machine get ``(0.0, 0.0)``, the others are measured."""
    mine = clock_id()
    me = torch_compat.current_agent().get_worker_info().name if rpc.is_available() else None
    found = {}
    for name, theirs in members.items():
        if theirs == mine or name == me:
            found[name] = (0.0, 0.0)
        else:
            try:
                found[name] = estimate(name, timeout=timeout)
            except (RuntimeError, TimeoutError):
                found[name] = (0.0, float("inf"))  # gone meanwhile: unknown
    return found
