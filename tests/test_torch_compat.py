"""Every private part of torch nbrpc uses is still there, in one place (``torch_compat``).

A torch upgrade that renames or removes one fails here, by name, rather than deep in a
cluster start.
"""

from __future__ import annotations

import json
import subprocess
import sys

from nbrpc import torch_compat

NAMES = (
    "init_rpc_backend", "init_dist_autograd", "current_agent", "has_agent", "set_rpc_timeout",
    "debug_info", "rref_debug_info", "delete_all_rrefs", "STORE_LOCK_KEY", "STORE_MEMBERS_KEY",
    "TRANSPORTS_OPTION",
    "update_group_membership", "to_worker_info", "invoke_rpc", "require_initialized",
    "call_thread_state", "rpc_sync", "rpc_async", "remote", "find_builtin", "ASYNC_EXECUTION_MARK",
    "RPCExecMode", "UNSET_RPC_TIMEOUT", "PythonUDF", "RemoteException", "torch_pickler",
    "torch_unpickler", "handle_exception", "PyRRef", "rref_init", "to_here", "rref_from_fork_data",
    "fork_data", "retrieve_context", "backward", "send_functions", "recv_functions",
    "known_worker_ids", "RREF_HELPERS", "creation_future", "rref_type", "current_context_id",
    "tensor_tables", "OPTIMIZER_STEPS", "keep_thread_state",
)


def test_every_name_is_there():
    missing = [name for name in NAMES if getattr(torch_compat, name, None) is None]
    assert not missing
    torch_compat.check()  # the private methods of torch's C++ classes
    assert {"SYNC", "ASYNC"} <= set(torch_compat.RPCExecMode.__members__)


def test_the_patch_points_exist_in_torch():
    for name in ("PICKLER", "UNPICKLER", "HANDLE_EXCEPTION", "TO_WORKER_INFO", "RPC_SYNC",
                 "RPC_ASYNC", "REMOTE", "RREF_INIT", "RREF_TO_HERE", "BACKWARD"):
        for owner, attribute in getattr(torch_compat, name):
            assert hasattr(owner, attribute), (name, owner, attribute)
    from torch.distributed.optim import optimizer

    assert all(callable(getattr(optimizer, name)) for name in torch_compat.OPTIMIZER_STEPS)


INSTALL_AND_UNINSTALL = """
import json
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch._C._distributed_rpc import PyRRef
from torch.distributed.rpc import api, internal

from nbrpc import autograd, calls, rref_ledger, serialization, torch_compat

def now():
    return [api._to_worker_info, api.rpc_sync, rpc.rpc_sync, api.rpc_async, api.remote, rpc.remote,
            internal._pickler, internal._unpickler, internal._handle_exception,
            PyRRef.__init__, PyRRef.to_here, dist_autograd.backward]

torch_before = now()
torch_compat.install(track=True)
autograd.record_autograd(True)
installed = now()
torch_compat.uninstall()
print(json.dumps({
    "replaced": [a is not b for a, b in zip(torch_before, installed)],
    "ours": [installed[1] is calls.rpc_sync, installed[4] is rref_ledger.remote,
             installed[6] is serialization.RpcPickler],
    "restored": [a is b for a, b in zip(torch_before, now())],
}))
"""


def test_install_puts_every_patch_in_place_and_uninstall_takes_it_back(tmp_path):
    done = subprocess.run([sys.executable, "-c", INSTALL_AND_UNINSTALL], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(report["replaced"]) and all(report["ours"]), report
    assert all(report["restored"]), report
