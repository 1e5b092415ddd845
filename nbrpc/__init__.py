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
    "Cluster",
    "ClusterRunningError",
    "NoClusterError",
    "RemoteError",
    "RpcTimeoutError",
    "SerializationError",
    "UnknownWorkerError",
    "WorkerDiedError",
    "WorkerStartError",
    "current",
    "start",
]

    "autograd_snapshot",

    "last_recorded",
    "record_autograd",
    "rref_snapshot",
def start(n=None, **options) -> Cluster:
    """Start a cluster (what ``%rpc_init`` does) and return it.

    Takes ``Cluster``'s options; start-up progress shows as a bar in a notebook and
    as text elsewhere.
    """
    if "progress" not in options and "ipykernel" in sys.modules:
        from .kernel_ext.display import start_progress

        options["progress"] = start_progress()
    return Cluster(n, **options).start()


def load_ipython_extension(ipython):
    """``%load_ext nbrpc``: register the magics."""
    from .kernel_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .kernel_ext import unload_ipython_extension as unload

    unload(ipython)
