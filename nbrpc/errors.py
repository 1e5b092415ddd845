"""Every error nbrpc raises: each says what happened and what to do next."""

from __future__ import annotations

import re

__all__ = [
    "ClusterRunningError",
    "DeviceMapError",
    "JobRefusedError",
    "JoinRefusedError",
    "LimitError",
    "NoClusterError",
    "NotRecordingError",
    "RemoteError",
    "RpcTimeoutError",
    "SerializationError",
    "UnknownWorkerError",
    "WorkerDiedError",
    "WorkerStartError",
]


class _OneLine:
    """An error whose message says it all: IPython shows that one line, not the frames
    of nbrpc that raised it (``_render_traceback_``, as IPython's own ``UsageError``)."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {self}"]


class WorkerStartError(RuntimeError):
    """A worker kernel did not join the RPC group within the start timeout."""


class WorkerDiedError(RuntimeError):
    """A call went to a worker whose process has ended."""


class RpcTimeoutError(TimeoutError, RuntimeError):
    """An RPC got no answer within its timeout.

    Also a ``RuntimeError``, which torch raises for a timeout, and its message keeps
    torch's text: code written against torch's error still catches it."""


class UnknownWorkerError(ValueError, RuntimeError):
    """A worker name (or id) that is not part of the running cluster.

    Also a ``RuntimeError``, which torch raises for an unknown destination: code
    written against torch's error still catches it."""


class SerializationError(TypeError):
    """An RPC argument or return value that cannot be pickled."""


class DeviceMapError(ValueError):
    """GPU options (``gpus``, ``device_maps``) that torch's CUDA RPC cannot do here."""


class ClusterRunningError(RuntimeError):
    """A second cluster was requested while one is running in this process."""


class NoClusterError(_OneLine, RuntimeError):
    """An operation that needs a running cluster found none."""


class NotRecordingError(_OneLine, RuntimeError):
    """The running cluster records no calls (it was started without ``trace=True``)."""


# torch's words for "RPC (or distributed autograd) is not set up in this process":
# ``_require_initialized``'s "Call ... init_rpc first", the agent's and autograd's.
NOT_INITIALIZED = re.compile(
    r"RPC has not been initialized|init_rpc first|Current RPC agent is not set"
    r"|RPC agent .* not (?:been )?(?:set|initialized)|Need to initialize distributed autograd"
    r"|dist_autograd.* not .*initialized", re.IGNORECASE)
RUN_RPC_INIT = ("RPC is not running in this notebook yet: run %rpc_init first "
                "(after %load_ext nbrpc), then this cell again")


def not_initialized(error: BaseException) -> bool:
    """Whether ``error`` is torch saying that RPC was used before it was started."""
    return isinstance(error, RuntimeError) and bool(NOT_INITIALIZED.search(str(error)))


class JoinRefusedError(PermissionError):
    """The driver refused a worker's join (wrong or missing token, a name taken)."""


class JobRefusedError(ValueError):
    """The batch system refused the workers' job (``sbatch``'s own message)."""


class LimitError(_OneLine, ValueError):
    """A cluster asked for more than a limit the server's administrator set (``limits``)."""


class AutogradContextError(_OneLine, LookupError):
    """A distributed autograd context that no worker has (its block has exited)."""


class RemoteError(RuntimeError):
    """Code run on workers with ``Cluster.run`` (``%%rpc_on``) raised.

    ``failures`` maps each failing worker's name to ``(ename, evalue, traceback)``,
    the traceback as the worker's kernel formatted it.
    """

    def __init__(self, failures: dict[str, tuple[str, str, list[str]]]):
        self.failures = failures
        parts = [f"{name}: {ename}: {evalue}" for name, (ename, evalue, _) in failures.items()]
        super().__init__("code raised on " + "; ".join(parts))

    def _render_traceback_(self) -> list[str]:
        lines = []
        for name, (ename, evalue, traceback) in self.failures.items():
            # The traceback ends with the whole message (a remote error's carries the
            # remote traceback's text): the heading keeps its first line.
            head = evalue.split("\n", 1)[0] if traceback else evalue
            lines.append(f"\x1b[31m[{name}]\x1b[0m raised {ename}: {head}")
            lines.extend(traceback)
        return lines
