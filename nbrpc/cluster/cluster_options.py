"""A cluster's own options, declared once for ``Cluster`` and ``%rpc_init``'s flags.

``ClusterOptions`` checks itself; the launchers' options are in ``launchers.options``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..group.membership import DEFAULT_TRANSPORT, TRANSPORTS
from ..launchers.options import option


@dataclass(frozen=True)
class ClusterOptions:
    """TensorPipe's threads and transport, the default RPC timeout, the start's limit, and
    whether calls are served on torch's threads only."""

    threads: int = option(16, "TensorPipe worker threads per member (default 16, or the server's default)",
                                 type=int)
    timeout: float = option(60.0, "default RPC timeout in seconds (default 60, at most the server's limit)",
                             type=float)
    startup_timeout: float = option(60.0, "seconds to wait for workers to join (default 60)", type=float)
    transport: str | None = option(
        None, f"TensorPipe's transport in every member: {DEFAULT_TRANSPORT} (TCP, the default: no CPU at "
        "rest) or shm (torch's default: shared memory, a little faster per small call, but a polling "
        "thread keeps a core busy in every member, idle or not); fixed by the first cluster of a kernel",
        choices=tuple(TRANSPORTS))
    torch_threads_only: bool = option(
        False, "serve every call on torch's own RPC threads, as torch does: functions that block on other "
        "calls can then take every thread (torch's thread-pool deadlock, to show it); default: nbrpc hands "
        "such calls to threads of its own", action="store_true")

    def __post_init__(self):
        for label in ("threads", "timeout", "startup_timeout"):
            value = getattr(self, label)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{label} must be a positive number, got {value!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(map(repr, TRANSPORTS))}, "
                             f"got {self.transport!r}")


DEFAULTS = ClusterOptions()
