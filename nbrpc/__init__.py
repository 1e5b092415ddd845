"""nbrpc: PyTorch's distributed RPC, interactive in Jupyter."""

import os
import sys

if "torch" not in sys.modules:
    # torch reads this once: large tensors in huge pages make big RPC transfers
    # several times faster. Workers always get it; the driver only if nbrpc is
    # imported (or %load_ext nbrpc runs) before torch.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from .cluster import Cluster, current, start  # noqa: E402
from .errors import (  # noqa: E402
    ClusterRunningError,
    NoClusterError,
    RemoteError,
    RpcTimeoutError,
    SerializationError,
    UnknownWorkerError,
    WorkerDiedError,
    WorkerStartError,
)

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


def load_ipython_extension(ipython):
    """``%load_ext nbrpc``: register the magics."""
    from .kernel_ext import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    from .kernel_ext import unload_ipython_extension as unload

    unload(ipython)
