"""nbrpc: PyTorch's distributed RPC, interactive in Jupyter."""

import os
import sys

if "torch" not in sys.modules:
    # torch reads this once: large tensors in huge pages make big RPC transfers
    # several times faster. Workers always get it; the driver only if nbrpc is
    # imported (or %load_ext nbrpc runs) before torch.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from .autograd import autograd_snapshot, last_recorded, record_autograd  # noqa: E402
from .cluster import Cluster, current  # noqa: E402
from .errors import (  # noqa: E402
    AutogradContextError,
    ClusterRunningError,
    NoClusterError,
    RemoteError,
    RpcTimeoutError,
    SerializationError,
    UnknownWorkerError,
    WorkerDiedError,
    WorkerStartError,
)
from .rrefs import rref_snapshot  # noqa: E402

__all__ = [
    "AutogradContextError",
    "AutogradGraph",
    "Cluster",
    "ClusterRunningError",
    "ClusterStatus",
    "NoClusterError",
    "RRefGraph",
    "RemoteError",
    "RpcTimeoutError",
    "SerializationError",
    "UnknownWorkerError",
    "WorkerDiedError",
    "WorkerStartError",
    "autograd_snapshot",
    "current",
    "last_recorded",
    "record_autograd",
    "rref_snapshot",
    "start",
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


# The widgets import ipywidgets, which a script driving a cluster must not pay for:
# these build one on first use. The classes are nbrpc.widgets.RRefGraph, ...


def RRefGraph(live: bool = True, **options):  # noqa: N802
    """The live RRef ownership graph widget (``nbrpc.widgets.RRefGraph``)."""
    from .widgets.rref_graph import RRefGraph as widget

    return widget(live, **options)


def AutogradGraph(context_or_snapshot=None, **options):  # noqa: N802
    """A distributed autograd context's graph widget (``nbrpc.widgets.AutogradGraph``)."""
    from .widgets.autograd_graph import AutogradGraph as widget

    return widget(context_or_snapshot, **options)


def ClusterStatus(live: bool = True, **options):  # noqa: N802
    """What ``%rpc_status`` shows, refreshing (``nbrpc.widgets.ClusterStatus``)."""
    from .widgets.status import ClusterStatus as widget

    return widget(live, **options)


def load_ipython_extension(ipython):
    """``%load_ext nbrpc``: register the magics."""
    from .kernel_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .kernel_ext import unload_ipython_extension as unload

    unload(ipython)
