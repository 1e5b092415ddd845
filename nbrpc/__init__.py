"""nbrpc: PyTorch's distributed RPC, interactive in Jupyter."""

import os
import sys

if "torch" not in sys.modules:
    # torch reads this once: large tensors in huge pages make big RPC transfers
    # several times faster. Workers always get it; the driver only if nbrpc is
    # imported (or %load_ext nbrpc runs) before torch.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from .launchers import template as _template  # noqa: E402  (no torch)

# In a notebook (``%load_ext nbrpc`` or ``import nbrpc``) the warm template starts now,
# so that its import of torch runs beside this kernel's, not after it.
_template.prestart_in_kernel()

from .cluster import queries as _queries  # noqa: E402
from .cluster.cluster import Cluster, current  # noqa: E402
from .diagnostics.autograd import autograd_snapshot, last_recorded, record_autograd  # noqa: E402
from .diagnostics.rrefs import rref_snapshot  # noqa: E402
from .diagnostics.trace import Trace, trace, trace_snapshot  # noqa: E402
from .errors import (  # noqa: E402
    AutogradContextError,
    ClusterRunningError,
    DeviceMapError,
    JobRefusedError,
    NoClusterError,
    RemoteClassError,
    RemoteError,
    RpcTimeoutError,
    SerializationError,
    UnknownWorkerError,
    WorkerDiedError,
    WorkerStartError,
)
from .launchers.slurm import SlurmOptions  # noqa: E402

__all__ = [
    "AutogradContextError",
    "AutogradGraph",
    "Cluster",
    "ClusterRunningError",
    "DeviceMapError",
    "ClusterStatus",
    "JobRefusedError",
    "NoClusterError",
    "RRefGraph",
    "RemoteClassError",
    "RemoteError",
    "RpcTimeoutError",
    "SerializationError",
    "SlurmOptions",
    "Timeline",
    "Trace",
    "UnknownWorkerError",
    "WaitsGraph",
    "WorkerDiedError",
    "WorkerStartError",
    "autograd_snapshot",
    "current",
    "last_recorded",
    "record_autograd",
    "rref_snapshot",
    "stacks",
    "start",
    "trace",
    "trace_snapshot",
    "waits",
]


def start(n=None, **options) -> Cluster:
    """Start a cluster (what ``%rpc_init`` does) and return it.

    Takes ``Cluster``'s options; start-up progress shows as a bar in a notebook and
    as text elsewhere.
    """
    if "progress" not in options and "ipykernel" in sys.modules:
        from .kernel_ext.display import start_progress

        options["progress"] = start_progress()
    return Cluster(n, **options).start()


def waits() -> dict:
    """The running cluster's pending calls as a wait-for graph, with the hangs it names
    (``findings``); asked over each worker's side channel, so it answers while every RPC
    thread is blocked. Its shape: the documentation's "When a cell hangs" (docs/guide/hangs.md)."""
    return _queries.waits(current())


def stacks(members=None) -> dict:
    """The Python stack of every thread of every member (or of ``members``, names):
    member -> ``{"state", "pid", "threads": [{"id", "name", "serving", "frames"}]}``;
    a notebook frame carries its ``cell`` ("cell 3, line 6") and source line."""
    if isinstance(members, str):
        members = [m.strip() for m in members.split(",") if m.strip()]
    return _queries.stacks(current(), members)


# The widgets import ipywidgets, which a script driving a cluster must not pay for:
# ``nbrpc.RRefGraph`` and the others are the classes of ``nbrpc.widgets``, imported
# on first use.
_WIDGETS = {"AutogradGraph": "autograd_graph", "ClusterStatus": "status", "RRefGraph": "rref_graph",
            "Timeline": "timeline", "WaitsGraph": "waits_graph"}


def __getattr__(name: str):
    if name in _WIDGETS:
        import importlib

        return getattr(importlib.import_module(f".widgets.{_WIDGETS[name]}", __name__), name)
    raise AttributeError(f"module 'nbrpc' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext nbrpc``: register the magics."""
    from .kernel_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .kernel_ext import unload_ipython_extension as unload

    unload(ipython)
