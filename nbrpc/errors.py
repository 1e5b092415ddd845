"""Every error nbrpc raises: each says what happened and what to do next."""

from __future__ import annotations

__all__ = [
    "ClusterRunningError",
    "DeviceMapError",
    "JobRefusedError",
    "JoinRefusedError",
    "LimitError",
    "NoClusterError",
    "RemoteError",
    "RpcTimeoutError",
    "SerializationError",
    "UnknownWorkerError",
    "WorkerDiedError",
    "WorkerStartError",
]


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


class NoClusterError(RuntimeError):
    """An operation that needs a running cluster found none."""


class JoinRefusedError(PermissionError):
    """The driver refused a worker's join (wrong or missing token, a name taken)."""


class JobRefusedError(ValueError):
    """The batch system refused the workers' job (``sbatch``'s own message)."""


class LimitError(ValueError):
    """A cluster asked for more than a limit the server's administrator set (``limits``)."""


class AutogradContextError(LookupError):
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
            lines.append(f"\x1b[31m[{name}]\x1b[0m raised {ename}: {evalue}")
            lines.extend(traceback)
        return lines
