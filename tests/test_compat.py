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
import types

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import optimizer_steps_sent
from jupyter_client.blocking import BlockingKernelClient
from rpc_profiling import release_profiling_key
from torch._C._distributed_rpc import PyRRef

from nbrpc._compat import cloudpickle_compat as cp
from nbrpc._compat import debugger_compat, jupyter_compat, rpc_pickler, rpc_sync_code, script_functions, torch_compat


def test_torchs_private_methods_are_there_and_a_missing_one_is_named(monkeypatch):
    torch_compat.check()  # the private methods of torch's C++ classes
    assert {"SYNC", "ASYNC"} <= set(torch_compat.RPCExecMode.__members__)
    monkeypatch.setattr(torch_compat, "METHODS", (*torch_compat.METHODS, (PyRRef, "_no_such_method")))
    with pytest.raises(AttributeError, match=r"lacks PyRRef._no_such_method"):
        torch_compat.check()


def test_torchs_rpc_pickler_has_the_tables_nbrpcs_serialize_fills():
    from torch.distributed.rpc import internal

    pickler = internal._InternalRPCPickler()
    table, size, reducers = rpc_pickler.table_state(pickler)
    assert table is pickler._dispatch_table and size == len(table) and reducers == 0
    filled, prepared = rpc_pickler.prepared_table(pickler, None)
    assert filled is table and callable(filled[rpc.PyRRef]) and callable(filled[rpc.RRef]) and prepared == (table, 0)
    assert rpc_pickler.prepared_table(pickler, prepared) == (table, prepared)
    assert callable(rpc_pickler.script_module_reducer(pickler))


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


def test_ipykernels_private_name_publishes_a_debug_event():
    import inspect

    from ipykernel.kernelbase import Kernel

    # What the kernel's own debugger is handed as its event callback (ipykernel's
    # IPythonKernel), so members' events are sent as the driver's own;
    # test_lab_debugger.py sees them arrive on IOPub.
    assert list(inspect.signature(Kernel._publish_debug_event).parameters) == ["self", "event"]
    assert "debug_event" in inspect.getsource(Kernel._publish_debug_event)


@pytest.mark.slow
def test_debugpys_patches_of_process_creation_are_undone():
    import subprocess
    import sys

    # In a process of its own: the patches are process-wide.
    code = ("import os, subprocess, _posixsubprocess\n"
            "from debugpy.server import api\n"
            "from _pydev_bundle import pydev_monkey\n"
            "pydev_monkey.patch_new_process_functions()\n"
            "assert subprocess._fork_exec is not _posixsubprocess.original_fork_exec\n"
            "from nbrpc._compat import jupyter_compat\n"
            "jupyter_compat.stop_debugging_new_processes()\n"
            "assert subprocess._fork_exec is _posixsubprocess.fork_exec is _posixsubprocess.original_fork_exec\n"
            "assert os.fork is os.original_fork and os.execv is os.original_execv\n"
            "pydev_monkey.patch_new_process_functions()  # debugpy does not patch again\n"
            "assert subprocess._fork_exec is _posixsubprocess.fork_exec\n"
            "print(subprocess.run(['echo', 'plain'], capture_output=True, text=True).stdout)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "plain", done.stderr


def test_pydevds_marks_of_its_own_threads_are_read_by_it():
    import importlib
    import inspect
    import threading

    from debugpy.server import api  # noqa: F401  (puts pydevd on the path)

    pydevd_utils = importlib.import_module("_pydevd_bundle.pydevd_utils")
    pydevd_trace_dispatch_regular = importlib.import_module("_pydevd_bundle.pydevd_trace_dispatch_regular")

    thread = threading.Thread(target=lambda: None)
    jupyter_compat.hide_from_debugger(thread)
    assert thread.pydev_do_not_trace and thread.is_pydev_daemon_thread
    # pydevd neither traces nor pauses a thread with these marks (ipykernel's own use them).
    assert "is_pydev_daemon_thread" in inspect.getsource(pydevd_utils)
    assert "pydev_do_not_trace" in inspect.getsource(pydevd_trace_dispatch_regular)


def test_the_patch_points_exist_in_torch():
    for name in ("PICKLER", "UNPICKLER", "SERIALIZE", "TO_WORKER_INFO", "RPC_SYNC",
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
            internal._pickler, internal._unpickler, internal._InternalRPCPickler.serialize,
            PyRRef.__init__, PyRRef.to_here, dist_autograd.backward,
            TensorPipeAgent.__init__, TensorPipeAgent._update_group_membership]

torch_before = now()
patches.install(track=True)
installed = now()
torch_compat.uninstall()
print(json.dumps({
    "replaced": [a is not b for a, b in zip(torch_before, installed)],
    "ours": [installed[1] is wrappers.rpc_sync, installed[4] is wrappers.remote,
             installed[6] is serialization.RpcPickler, installed[8] is serialization.serialize,
             installed[11] is backward.backward],
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


# -- the kinds of callable torch's _invoke_rpc tells apart ----------------------------


@torch.jit.script
def script_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x + y


@rpc.functions.async_execution
@torch.jit.script
def async_script_add(to: str, x: torch.Tensor, y: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    return rpc.rpc_async(to, script_add, (x, y))


def python_add(x, y):
    return x + y


@rpc.functions.async_execution
def async_python_add(x, y):
    fut = torch.futures.Future()
    fut.set_result(x + y)
    return fut


class Adder:
    def add(self, x, y):
        return x + y


def test_invoke_rpc_and_remote_have_the_branches_call_kind_follows():
    # torch 2.11 to 2.15: a builtin first, then an @async_execution wrapper's TorchScript
    # function in its place, then TorchScript, then a pickled Python function; a torch
    # that adds, drops or reorders a branch fails here (and call_kind must follow it).
    # torch's own (a cluster put nbrpc's remote in its place)
    for function, prefix in ((torch_compat.invoke_rpc, "_invoke_rpc"), (torch_compat.remote, "_invoke_remote")):
        called = calls_in(function)
        tested = [name for name in called if name in ("torch.jit._builtins._find_builtin", "hasattr", "isinstance")]
        assert tested == ["torch.jit._builtins._find_builtin", "hasattr", "isinstance", "isinstance"], function
        branches = [name for name in called if name.startswith(prefix + "_")]
        assert branches == [f"{prefix}_builtin", f"{prefix}_torchscript", f"{prefix}_python_udf"], function
        source = __import__("inspect").getsource(function)
        assert f'hasattr(func, "{torch_compat.ASYNC_EXECUTION_MARK}")' in source
        assert "isinstance(wrapped, torch.jit.ScriptFunction)" in source


def test_a_script_functions_source_compiles_under_another_name():
    """``_compat/script_functions``: torch's Python function behind a ``ScriptFunction``, its
    source read as torch reads it and compiled again under a name of nbrpc's, the names
    it uses resolved in its module; a function compiled again gets torch's mangled name."""
    function = script_functions.python_function(script_add)
    assert function.__name__ == "script_add"
    found = script_functions.source_of(script_add)
    assert found.source.startswith("@torch.jit.script\ndef script_add(x: torch.Tensor"), found
    assert (found.name, found.module, found.first_line) == ("script_add", __name__, function.__code__.co_firstlineno)
    name = f"__torch__.compat_test_{id(found)}.script_add"
    assert script_functions.find(name) is None
    compiled = script_functions.compile_as(name, found)
    assert compiled.qualified_name == name and script_functions.find(name) is not None
    assert torch.equal(compiled(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))
    again = torch.jit.script(types.FunctionType(function.__code__, function.__globals__, "script_add"))
    assert script_functions.MANGLE_MARK in again.qualified_name, again.qualified_name


# Each C++ call under torch's branches, and where its is_async argument is (None: it has none).
BRANCHES = {"_invoke_rpc_builtin": None, "_invoke_rpc_torchscript": 5, "_invoke_rpc_python_udf": 4,
            "_invoke_remote_builtin": None, "_invoke_remote_torchscript": 3, "_invoke_remote_python_udf": 4}


def _watch_branches(monkeypatch) -> list:
    """Record which of torch's C++ calls each call takes, with its is_async (the calls go on)."""
    taken = []

    def watching(name, call):
        def watched(*args, **kwargs):
            position = BRANCHES[name]
            taken.append((name, None if position is None else args[position]))
            return call(*args, **kwargs)
        return watched

    for name in BRANCHES:
        monkeypatch.setattr(rpc.api, name, watching(name, getattr(rpc.api, name)))
        if hasattr(torch_compat, name):
            monkeypatch.setattr(torch_compat, name, watching(name, getattr(torch_compat, name)))
    return taken


def _callables() -> dict:
    """One callable of each kind torch tells apart (and the carriers nbrpc sends)."""
    from nbrpc.calls import interrupts

    return {
        "builtin": (torch.add, (torch.ones(2), 1)),
        "ScriptFunction": (script_add, (torch.ones(2), torch.ones(2))),
        "async_execution of a ScriptFunction": (async_script_add, ("master", torch.ones(2), torch.ones(2))),
        "Python function": (python_add, (torch.ones(2), 1)),
        "async_execution of a Python function": (async_python_add, (torch.ones(2), 1)),
        "bound method": (Adder().add, (torch.ones(2), 1)),
        "class": (torch.nn.Identity, ()),
        "Stoppable": (interrupts.Stoppable((python_add, interrupts.new_call_id(), None)), (torch.ones(2), 1)),
        "Awaited": (interrupts.Awaited((async_python_add, interrupts.new_call_id(), None)), (torch.ones(2), 1)),
    }


def _value(got):
    value = got.to_here(timeout=30) if isinstance(got, PyRRef) else got.wait()
    return value.tolist() if isinstance(value, torch.Tensor) else type(value).__name__


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC", "REMOTE"])
def test_send_python_call_takes_torchs_branch_for_every_kind_of_callable(cluster, monkeypatch, request, mode,
                                                                         profiled):
    """torch's ``_invoke_rpc`` (``remote``) and ``send_python_call``, walked for each kind
    of callable to this member itself: the same C++ call, the same is_async, the same value."""
    import contextlib

    if profiled:  # a ScriptFunction's call leaves torch's profiling key set on this thread
        request.addfinalizer(release_profiling_key)
    taken = _watch_branches(monkeypatch)
    exec_mode = getattr(torch_compat.RPCExecMode, mode)
    kinds = {}
    for label, (func, args) in _callables().items():
        found = {}
        for who in ("torch", "nbrpc"):
            profiler = torch.autograd.profiler.profile() if profiled else contextlib.nullcontext()
            with profiler:
                if who == "nbrpc":
                    got = torch_compat.send_python_call("master", func, args, None, 30.0, exec_mode)
                elif mode == "REMOTE":
                    got = torch_compat.remote("master", func, args, None, 30.0)
                else:
                    got = torch_compat.invoke_rpc("master", func, exec_mode, args, None, 30.0)
                value = _value(got)
            found[who] = (taken.pop(), value)
            assert not taken, (label, who, taken)
        assert found["nbrpc"] == found["torch"], label
        kinds[label] = found["torch"][0]
    prefix = "_invoke_remote" if mode == "REMOTE" else "_invoke_rpc"
    # the branches as torch's docs name them, for the kinds it names
    assert kinds["builtin"] == (f"{prefix}_builtin", None)
    assert kinds["ScriptFunction"] == (f"{prefix}_torchscript", False)
    assert kinds["async_execution of a ScriptFunction"] == (f"{prefix}_torchscript", True)
    assert kinds["Python function"] == (f"{prefix}_python_udf", False)
    assert kinds["async_execution of a Python function"] == (f"{prefix}_python_udf", True)
    assert kinds["Stoppable"] == kinds["Awaited"] == (f"{prefix}_python_udf", True)


def test_rpc_sync_runs_torchs_own_code_with_another_invoke(cluster):
    """``rpc_sync_code``: torch's ``rpc_sync`` body (its frames in a traceback), with the
    ``_invoke_rpc`` given, whose result's ``wait()`` it returns; torch's check first."""
    sent = []

    class Done:
        def wait(self):
            return "waited"

    made = rpc_sync_code.rpc_sync_invoking(lambda *args: sent.append(args) or Done())
    assert made("worker1", len, args=(1,), timeout=3.0) == "waited"
    assert sent == [("worker1", len, torch_compat.RPCExecMode.SYNC, (1,), None, 3.0)]
    assert made.__wrapped__.__code__ is rpc.api.rpc_sync.__wrapped__.__code__
    assert made.__wrapped__.__defaults__ == rpc.api.rpc_sync.__wrapped__.__defaults__


def test_call_kind_names_each_kind_as_torch_sends_it():
    kinds = {label: torch_compat.call_kind(func) for label, (func, _) in _callables().items()}
    assert kinds["builtin"] == (torch_compat.BUILTIN, False)
    assert kinds["ScriptFunction"] == (torch_compat.SCRIPT, False)
    assert kinds["async_execution of a ScriptFunction"] == (torch_compat.SCRIPT, True)
    assert kinds["Python function"] == kinds["bound method"] == kinds["class"] == (torch_compat.PYTHON, False)
    assert kinds["async_execution of a Python function"] == (torch_compat.PYTHON, True)


def _future_of(x):
    fut = torch.futures.Future()
    fut.set_result(x + 1)
    return fut


def test_the_mark_the_futures_and_the_pickler_are_torchs(cluster):
    # a function marked as @async_execution marks it: torch's own path runs it so
    marked = torch_compat.mark_async_execution(lambda x: _future_of(x))
    assert torch_compat.is_async_execution(marked) and torch_compat.call_kind(marked) == (torch_compat.PYTHON, True)
    assert torch_compat.is_async_execution(rpc.functions.async_execution(_future_of))
    assert not torch_compat.is_async_execution(_future_of)
    assert torch_compat.invoke_rpc("master", marked, torch_compat.RPCExecMode.SYNC, (1,), None, 30.0).wait() == 2
    # a class marked so: its instances are sent as @async_execution functions
    holder = torch_compat.mark_async_execution(type("Later", (), {"__call__": lambda self, x: _future_of(x)}))
    assert torch_compat.call_kind(holder()) == (torch_compat.PYTHON, True)
    # torch's C++ future: under torch.futures.Future, and what then() makes
    fut = torch.futures.Future()
    assert isinstance(fut, torch_compat.CppFuture) and torch_compat.CppFuture in torch.futures.Future.__mro__
    assert type(fut.then(lambda f: 1)) is torch_compat.CppFuture is torch_compat.new_future
    # a message as torch's RPC pickles it: the pickle and the tensors beside it
    pickled, tensors = torch_compat.pickle_message(torch_compat.PythonUDF(len, (torch.ones(3),), {}))
    assert isinstance(pickled, bytes) and len(tensors) == 1 and tensors[0].tolist() == [1.0, 1.0, 1.0]
    # the pickler class torch's RPC uses, set and read back
    before = torch_compat.pickler_class()
    try:
        torch_compat.set_pickler_class(type("Other", (before,), {}))
        assert torch_compat.pickler_class().__name__ == "Other"
        assert rpc.internal._pickler is torch_compat.pickler_class()
    finally:
        torch_compat.set_pickler_class(before)



def test_pydevds_suspend_is_what_the_cluster_debugger_wraps():
    # In a process of its own: importing debugpy's server loads pydevd, which sets tracing up.
    code = ("import inspect, debugpy.server.api\n"
            "from nbrpc._compat import debugger_compat\n"
            "cls = debugger_compat.pydevd_debugger_class()\n"
            "print(list(inspect.signature(cls.do_wait_suspend).parameters)[:4])\n"
            "print(debugger_compat.on_suspend(print, print), debugger_compat.on_suspend(print, print))\n"
            "print(cls.do_wait_suspend._nbrpc_plain.__name__)\n")
    assert _in_a_fresh_process(code) == ["['self', 'thread', 'frame', 'event']", "True True", "do_wait_suspend"]


def test_pydevd_takes_breakpoints_in_the_files_a_worker_holds_in_memory():
    # pydevd's add_breakpoint refuses a missing file through pydevd_file_utils.exists, read by
    # attribute; wrapped, a held file passes, any other missing one still does not.
    code = ("import inspect, debugpy.server.api, pydevd_file_utils\n"
            "from _pydevd_bundle.pydevd_api import PyDevdAPI\n"
            "from nbrpc._compat import debugger_compat\n"
            "print('pydevd_file_utils.exists(' in inspect.getsource(PyDevdAPI.add_breakpoint))\n"
            "held = lambda path: path == '/nowhere/cell.py'\n"
            "print(debugger_compat.accept_breakpoints_in(held), debugger_compat.accept_breakpoints_in(held))\n"
            "exists = pydevd_file_utils.exists\n"
            "print(exists('/nowhere/cell.py'), exists('/nowhere/other.py'), exists(inspect.__file__))\n"
            "print(exists._nbrpc_plain.__name__)\n")
    assert _in_a_fresh_process(code) == ["True", "True True", "True False True", "exists"]


def _in_a_fresh_process(code: str) -> list[str]:
    """The lines ``code`` prints in a Python process of its own (pydevd, once loaded, traces it)."""
    done = subprocess.run([sys.executable, "-Xfrozen_modules=off", "-c", code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done
    return done.stdout.splitlines()


def test_a_hook_runs_on_the_thread_of_a_custom_functions_backward_and_is_undone():
    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", threading.get_ident()))
            return grad * 2

    seen = []
    plain = vars(torch.autograd.function.BackwardCFunction)["apply"]
    undo = debugger_compat.before_backward(lambda: seen.append(("hook", threading.get_ident())))
    try:
        x = torch.ones(2, requires_grad=True)
        Twice.apply(x).sum().backward()
    finally:
        undo()
    assert x.grad.tolist() == [2.0, 2.0]
    assert [what for what, _ in seen] == ["hook", "backward"] and seen[0][1] == seen[1][1], seen
    assert vars(torch.autograd.function.BackwardCFunction)["apply"] is plain
