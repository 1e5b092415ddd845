"""Every error nbrpc raises: each says what happened and what to do next.

Where torch's RPC raises a class, nbrpc's error is an instance of it (``TORCH_RAISES``),
so code written against torch's errors (``except RuntimeError:``) catches nbrpc's.
"""

from __future__ import annotations

import re

__all__ = [
    "TORCH_RAISES",
    "ClusterRunningError",
    "DeviceMapError",
    "JobRefusedError",
    "JoinRefusedError",
    "LimitError",
    "NoClusterError",
    "NotRecordingError",
    "RemoteClassError",
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


class SerializationError(TypeError, RuntimeError):
    """An RPC argument or return value that cannot be pickled.

    A ``TypeError``, which torch raises for an argument it cannot pickle, and a
    ``RuntimeError``, which it raises for a reply the callee could not pickle."""


class DeviceMapError(ValueError, RuntimeError):
    """GPU options (``gpus``, ``device_maps``) that torch's CUDA RPC cannot do here.

    A ``ValueError``, which torch raises for a device map it refuses, and a
    ``RuntimeError``, which it raises for device maps where it sees no GPU."""


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


class RemoteClassError(RuntimeError):
    """A remote exception of a class torch's RPC turns into a ``RuntimeError``, raised in
    its own class: the class it is raised as derives from both (``with_torch_class``), so
    ``except NotebookError:`` and torch's ``except RuntimeError:`` both catch it."""

    def __reduce__(self):
        # Pickled (sent on, copied) as an instance of its own class: the derived class is
        # this process's alone, and no module has it under the name it shows.
        return _remade, (remote_class(self), self.args, self.__dict__)


def _remade(cls: type, args: tuple, state: dict) -> BaseException:
    """An exception of class ``cls`` with ``args`` and ``state``, made without its
    ``__init__`` (which may take other arguments), as unpickling makes one."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


# The classes ``with_torch_class`` made, by the remote exception's own class.
_WITH_RUNTIME_ERROR: dict[type, type] = {}


def with_torch_class(error: BaseException) -> BaseException:
    """``error``, a remote exception torch would have raised as a ``RuntimeError``, made
    an instance of a class named as its own that derives from its own class and
    ``RemoteClassError``; left as it is if already a ``RuntimeError``, or if its class
    cannot take a class shared with ``RuntimeError`` (one with ``__slots__``)."""
    cls = type(error)
    if isinstance(error, RuntimeError) or not isinstance(error, Exception):
        return error
    made = _WITH_RUNTIME_ERROR.get(cls)
    try:
        if made is None:
            made = type(cls.__name__, (cls, RemoteClassError),
                        {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "remote_class": cls})
            _WITH_RUNTIME_ERROR[cls] = made
        error.__class__ = made
    except TypeError:  # an instance layout RuntimeError's cannot share
        pass
    return error


def remote_class(error: BaseException) -> type:
    """The class ``error`` was raised in on its worker (its own, under ``with_torch_class``)."""
    return type(error).remote_class if isinstance(error, RemoteClassError) and \
        hasattr(type(error), "remote_class") else type(error)


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


# Where torch's RPC raises a class and nbrpc raises its own error: what raw torch raised
# in a plain script (two processes, ``init_rpc``, torch 2.11 to 2.15) and nbrpc's class,
# which derives from it. ``tests/test_error_classes.py`` measures each row again on a
# real cluster and in a plain script; docs/guide/errors.md shows this table.
TORCH_RAISES: dict[str, tuple[type, type]] = {
    "an argument that cannot be pickled": (TypeError, SerializationError),
    "a reply that cannot be pickled (rpc_sync, rpc_async().wait(), remote().to_here())":
        (RuntimeError, SerializationError),
    "an unknown worker name or rank": (RuntimeError, UnknownWorkerError),
    "a call past its timeout (rpc_sync, rpc_async().wait(), to_here())": (RuntimeError, RpcTimeoutError),
    "a call to a worker whose process ended": (RuntimeError, WorkerDiedError),
    "a remote exception of a class torch does not re-create (one defined in the notebook; "
    "rpc_sync, rpc_async().wait())": (RuntimeError, RemoteClassError),
    "a call before RPC started, or after it stopped": (RuntimeError, NoClusterError),
    "a second start while RPC runs": (RuntimeError, ClusterRunningError),
    "a device map that is not one-to-one": (ValueError, DeviceMapError),
    "a device map where torch sees no GPU": (RuntimeError, DeviceMapError),
}
