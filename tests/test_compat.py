"""Every private name of torch, cloudpickle and jupyter_client that nbrpc uses is still
there and does what nbrpc needs, in one place (``nbrpc/_compat``).

An upgrade that renames or removes one fails here, by name, rather than deep in a
cluster start.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import optimizer_steps_sent
from jupyter_client.blocking import BlockingKernelClient
from torch._C._distributed_rpc import PyRRef

from nbrpc._compat import cloudpickle_compat as cp
from nbrpc._compat import jupyter_compat, torch_compat


def test_torchs_private_methods_are_there_and_a_missing_one_is_named(monkeypatch):
    torch_compat.check()  # the private methods of torch's C++ classes
    assert {"SYNC", "ASYNC"} <= set(torch_compat.RPCExecMode.__members__)
    monkeypatch.setattr(torch_compat, "METHODS", (*torch_compat.METHODS, (PyRRef, "_no_such_method")))
    with pytest.raises(AttributeError, match=r"lacks PyRRef._no_such_method"):
        torch_compat.check()


def test_the_names_nbrpc_spells_out_are_torchs(cluster):
    @rpc.functions.async_execution
    def later():
        pass

    assert hasattr(later, torch_compat.ASYNC_EXECUTION_MARK)
    # torch's options take the keyword (and refuse one they do not know)
    rpc.TensorPipeRpcBackendOptions(**{torch_compat.TRANSPORTS_OPTION: ["uv"]})
    with pytest.raises(TypeError):
        rpc.TensorPipeRpcBackendOptions(**{torch_compat.TRANSPORTS_OPTION + "_": ["uv"]})
    # the keys of torch's dynamic membership in a live group's store: the member list,
    # and the join/leave lock (free, and left by the last leave or join)
    members = torch.distributed.PrefixStore(cluster._driver.prefix, cluster._driver.store)
    listed = members.get(torch_compat.STORE_MEMBERS_KEY).decode()
    assert {entry.rsplit("-", 1)[0] for entry in listed.split(",") if entry} >= {"master", "worker1", "worker2"}
    assert members.get(torch_compat.STORE_LOCK_KEY) == b""


def test_the_autograd_context_is_found_without_an_exception_outside_one(cluster):
    import torch.distributed.autograd as dist_autograd

    assert torch_compat.context_id_or_none() is None
    with dist_autograd.context() as context_id:
        assert torch_compat.context_id_or_none() == context_id
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch_compat.context_id_or_none()))
        thread.start()
        thread.join()
        assert seen == [None]  # a context is per thread, though one exists in the process
    assert torch_compat.context_id_or_none() is None


def test_the_autograd_context_of_a_thread_is_read_and_set_as_torch_does(cluster):
    """``thread_context_id`` and ``set_thread_context_id`` (C++ functions through ctypes)
    agree with torch's own view of a thread's context; ``new_future`` is torch's future."""
    import torch.distributed.autograd as dist_autograd

    assert torch_compat.thread_context_id() == -1
    with dist_autograd.context() as context_id:
        assert torch_compat.thread_context_id() == context_id
        seen = []

        def elsewhere():
            seen.append(torch_compat.thread_context_id())
            torch_compat.set_thread_context_id(context_id)
            seen.append(dist_autograd._current_context()._context_id())
            torch_compat.set_thread_context_id(-1)
            seen.append(torch_compat.thread_context_id())

        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert seen == [-1, context_id, -1]
    assert torch_compat.thread_context_id() == -1
    fut = torch_compat.new_future([])
    fut.set_result(3)
    assert isinstance(fut, torch._C.Future) and fut.wait() == 3


def test_cloudpickles_private_names_do_what_definitions_needs():
    def outer():
        value = 41

        def inner(x):
            return json.dumps(x) + str(value)

        return inner

    inner = outer()
    assert cp.cell_contents(inner.__closure__[0]) == 41
    assert cp.cell_contents(cp.make_empty_cell()) is cp.EMPTY_CELL
    assert "json" in cp.code_globals(inner.__code__)

    class Point:
        scale = 2

        def norm(self):
            return 3

    _, name, bases, _, _, _ = cp.class_skeleton(Point)
    assert (name, bases) == ("Point", (object,))
    state = cp.class_state(Point)
    shell = type("Point", (object,), {})
    cp.set_class_state(shell, state)
    assert shell.scale == 2 and shell().norm() == 3


def test_jupyter_clients_private_name_adapts_the_protocol():
    client = BlockingKernelClient()
    jupyter_compat.take_kernel_info(client, {"content": {"protocol_version": "4.1"}})
    assert client.session.adapt_version == 4


def test_the_patch_points_exist_in_torch():
    for name in ("PICKLER", "UNPICKLER", "SERIALIZE", "HANDLE_EXCEPTION", "TO_WORKER_INFO", "RPC_SYNC",
                 "RPC_ASYNC", "REMOTE", "RREF_INIT", "RREF_TO_HERE", "BACKWARD", "COLLECT_ALL",
                 "AGENT_INIT", "AGENT_GROUP_MEMBERSHIP", "FUTURE_INIT"):
        for owner, attribute in getattr(torch_compat, name):
            assert hasattr(owner, attribute), (name, owner, attribute)


def test_every_optimizer_step_this_torch_sends_is_known():
    sent = optimizer_steps_sent()
    # the plain step and the functional optimizers' one (TorchScript's before 2.15)
    assert len(sent) == 2 and "_local_optimizer_step" in sent, sent
    assert set(sent) <= set(torch_compat.OPTIMIZER_STEPS), sent



INSTALL_AND_UNINSTALL = """
import json
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch._C._distributed_rpc import PyRRef, TensorPipeAgent
from torch.distributed.rpc import api, internal

from nbrpc._compat import torch_compat
from nbrpc.calls import backward, patches, wrappers
from nbrpc.wire import serialization

def now():
    return [api._to_worker_info, api.rpc_sync, rpc.rpc_sync, api.rpc_async, api.remote, rpc.remote,
            internal._pickler, internal._unpickler, internal._handle_exception,
            internal._InternalRPCPickler.serialize, PyRRef.__init__, PyRRef.to_here, dist_autograd.backward,
            TensorPipeAgent.__init__, TensorPipeAgent._update_group_membership]

torch_before = now()
patches.install(track=True)
installed = now()
torch_compat.uninstall()
print(json.dumps({
    "replaced": [a is not b for a, b in zip(torch_before, installed)],
    "ours": [installed[1] is wrappers.rpc_sync, installed[4] is wrappers.remote,
             installed[6] is serialization.RpcPickler, installed[9] is serialization.serialize,
             installed[12] is backward.backward],
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


def calls_in(function) -> list[str]:
    """The names ``function`` calls, in the order its source has them."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            found.append((node.lineno, node.col_offset, ast.unparse(func)))
    return [name for _, _, name in sorted(found)]


def test_init_rpc_has_the_steps_that_join_repeats():
    # ARCHITECTURE.md, "What a member's join does": init_rpc's steps and the order that
    # membership.join repeats (torch 2.11 to 2.15); a torch that adds or moves one fails here.
    steps = [name for name in calls_in(rpc.init_rpc) if name in (
        "torch._C._log_api_usage_once", "dist._create_store_from_options", "dist.rendezvous",
        "store.set_timeout", "dist.PrefixStore", "dist_autograd._init", "_set_profiler_node_id",
        "_init_rpc_backend")]
    assert steps == ["torch._C._log_api_usage_once", "dist._create_store_from_options",
                     "dist.rendezvous", "store.set_timeout", "dist.PrefixStore", "dist_autograd._init",
                     "_set_profiler_node_id", "_init_rpc_backend"]
    assert "_init_counter += 1" in __import__("inspect").getsource(rpc.init_rpc)
    backend = calls_in(rpc._init_rpc_backend)
    assert backend == ["_validate_rpc_args", "_is_current_rpc_agent_set", "RuntimeError",
                       "backend_registry.init_backend", "api._init_rpc_states"]
    assert torch_compat.init_rpc_backend is rpc._init_rpc_backend
    assert torch_compat.set_profiler_node_id is rpc._set_profiler_node_id
