"""torch's RPC profiling key, which one call can leave set on a thread for good.

torch's C++ ``rpcTorchscript`` (a TorchScript function through ``rpc_sync`` or ``rpc_async``)
sets a thread-local profiling key under any profiler, and only the legacy profiler, the one
that records RPCs, clears it when the call is sent. After such a call under the default
(Kineto) profiler, the next call under the legacy profiler on that thread raises "Cannot call
RemoteProfilerManager::setCurrentKey when current key is already set", in a plain script
under raw torch as in a notebook (``conformance/DIFFERENCES.md``). Tests share the pytest
process's main thread: a module that makes such calls there releases the key when done, so
that no later module depends on the order the modules ran in.
"""

from __future__ import annotations

import torch
import torch.distributed.rpc as rpc
from torch import Tensor


@torch.jit.script
def _double(x: Tensor) -> Tensor:
    return x * 2


@torch.jit.script
def _send_from_torchscript(to: str, x: Tensor) -> Tensor:
    return rpc.rpc_async(to, _double, (x,)).wait()


def release_profiling_key() -> None:
    """Clear this thread's RPC profiling key, set or not (RPC must be up): a TorchScript
    function's own ``rpc_async`` under the legacy profiler reaches torch's C++ call without
    torch's Python check of the key, and sending it clears the key."""
    with torch.autograd.profiler_legacy.profile():
        _send_from_torchscript(rpc.get_worker_info().name, torch.ones(1))
