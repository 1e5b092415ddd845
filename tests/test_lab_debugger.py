"""JupyterLab's debugger across the cluster, driven as JupyterLab drives it.

A real driver kernel (ipykernel, started by jupyter_client) with nbrpc and a cluster of
two real worker kernels. The test speaks the debug adapter protocol to the driver alone,
as JupyterLab does: ``debug_request``s on its control channel, ``debug_event``s read on
its IOPub; the members' threads must appear there as the driver's.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import execute, streamed, wait_gone
from dap import Dap, cell_value, stops_at
from unix_socket_kernels import UnixSocketKernelManager

pytestmark = pytest.mark.slow

F = "def f(x):\n    y = x + 1\n    return y * 2\n"
BOX = ("class Box:\n    def __init__(self, n):\n        self.n = n\n\n"
       "    def grow(self, x):\n        total = self.n + x\n        return total\n")
G = "def g(x):\n    twice = x * 2\n    return twice\n"
RPC_ON_CELL = "%%rpc_on worker2\nz = 5\nw = z * 3\nprint('w is', w)"
BACKWARD = ("import torch\nimport torch.distributed.autograd as dist_autograd\n\n"
            "def scaled(grad, by):\n    bigger = grad * by\n    return bigger\n\n"
            "class Twice(torch.autograd.Function):\n    @staticmethod\n    def forward(ctx, x):\n"
            "        return x * 2\n\n    @staticmethod\n    def backward(ctx, grad):\n"
            "        factor = 2\n        return scaled(grad, factor)\n\n"
            "def twice(x):\n    return Twice.apply(x)\n\n"
            "class Doubler(torch.nn.Module):\n    def forward(self, x):\n        return Twice.apply(x)\n")
SCALED_LINE, BACKWARD_LINE = 5, 16
OPTIMIZER = ("import torch\nimport torch.distributed.autograd as dist_autograd\n"
             "from torch.distributed.optim import DistributedOptimizer\n\n"
             "class Plain(torch.optim.Optimizer):\n    def __init__(self, params, lr):\n"
             "        super().__init__(params, {'lr': lr})\n\n    def step(self, closure=None):\n"
             "        for group in self.param_groups:\n            for p in group['params']:\n"
             "                change = p.grad * group['lr']\n                p.data.sub_(change)\n\n"
             "def new_weight():\n    return torch.ones(2, requires_grad=True)\n")
STEP_LINE = 13
FIRST_OPTIMIZER = "import torch.distributed.optim\n_ = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)"


@pytest.fixture(scope="module")
def lab():
    """A driver kernel with JupyterLab's debugger on, then ``%rpc_init -n 2``; its ``Dap``."""
    km = UnixSocketKernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    pid = km.provisioner.pid
    try:
        kc.wait_for_ready(timeout=120)
        dap = Dap(kc)
        # torch imported first: under a debugger an import of torch takes minutes (debugpy
        # traces every line), with or without nbrpc; so does what a process's first
        # optimizer imports (torch._dynamo), on the driver and on the workers.
        _, reply = execute(kc, "%load_ext nbrpc\nimport os\nimport nbrpc\nimport torch.distributed.rpc as rpc\n"
                               + FIRST_OPTIMIZER, timeout=240)
        assert reply["status"] == "ok", reply
        # The debugger switched on before the cluster starts: its members join it as they come.
        assert dap.request("initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
                           linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True,
                           locale="en")["success"]
        assert dap.request("attach")["success"]
        _, reply = execute(kc, "%%rpc_init -n 2 --timeout 300\n" + FIRST_OPTIMIZER, timeout=240)
        assert reply["status"] == "ok", reply
        info = dap.request("debugInfo")
        assert info["success"] and info["body"]["isStarted"]
        source = dap.request("dumpCell", code=F)["body"]["sourcePath"]
        breakpoints = dap.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 2}],
                                  sourceModified=False)
        assert breakpoints["success"] and breakpoints["body"]["breakpoints"][0]["verified"], breakpoints
        assert dap.request("configurationDone")["success"]
        _, reply = execute(kc, F)
        assert reply["status"] == "ok", reply
        dap.source = source
        yield dap
        dap.request("disconnect", restart=False, terminateDebuggee=False)
        # The default timeout, none while the debugger was on, is the cluster's again.
        printed, _ = execute(kc, "%%rpc_on worker1\nimport torch.distributed.rpc as rpc\nprint(rpc.get_rpc_timeout())")
        assert "[worker1] 300.0" in streamed(printed), printed
        _, reply = execute(kc, "pass", user_expressions={"t": "rpc.get_rpc_timeout()"})
        assert reply["user_expressions"]["t"]["data"]["text/plain"] == "300.0", reply
        execute(kc, "%rpc_shutdown", timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        km.cleanup_resources()
    assert not wait_gone([pid], timeout=10)


def _pids(dap) -> dict[str, int]:
    _, reply = execute(dap.client, "pids = {w.name: w.pid for w in nbrpc.current().workers}",
                       user_expressions={"pids": "pids"})
    return eval(reply["user_expressions"]["pids"]["data"]["text/plain"])


def _stops_in_f(dap, member: str, x: int) -> int:
    """The member stopped at f's line 2 with ``x``: its thread, named for it."""
    stopped = dap.event("stopped")
    thread = stopped["body"]["threadId"]
    names = {t["id"]: t["name"] for t in dap.request("threads")["body"]["threads"]}
    assert names[thread].startswith(f"{member}: "), names
    frame = dap.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (dap.source, 2), frame
    assert dap.locals_of(frame)["x"] == str(x)
    return thread


def test_a_breakpoint_in_a_cells_function_stops_on_the_member_rpc_sync_runs_it_on(lab):
    pid = _pids(lab)["worker1"]
    cell = lab.client.execute('rpc.rpc_sync("worker1", f, args=(3,))')
    thread = _stops_in_f(lab, "worker1", 3)
    frame = lab.top_frame(thread)
    here = lab.request("evaluate", expression="(__import__('os').getpid(), x * 10)", frameId=frame["id"],
                       context="repl")
    assert here["success"] and here["body"]["result"] == f"({pid}, 30)", here
    assert thread in lab.request("debugInfo")["body"]["stoppedThreads"]

    assert lab.request("next", threadId=thread)["success"]
    assert lab.event("stopped")["body"]["threadId"] == thread
    frame = lab.top_frame(thread)
    assert frame["line"] == 3 and lab.locals_of(frame)["y"] == "4"

    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "8"
    assert thread not in lab.request("debugInfo")["body"]["stoppedThreads"]


def test_rpc_async_and_remote_stop_there_too(lab):
    cell = lab.client.execute('rpc.rpc_async("worker2", f, args=(4,)).wait()')
    thread = _stops_in_f(lab, "worker2", 4)
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "10"

    cell = lab.client.execute('rpc.remote("worker1", f, args=(5,)).to_here()')
    thread = _stops_in_f(lab, "worker1", 5)
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "12"


def test_a_call_through_an_rref_proxy_stops_in_the_cell_classs_method(lab):
    source = lab.request("dumpCell", code=BOX)["body"]["sourcePath"]
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 6}])["success"]
    _, reply = execute(lab.client, BOX)
    assert reply["status"] == "ok", reply
    cell = lab.client.execute('rpc.remote("worker2", Box, args=(10,)).rpc_sync().grow(5)')
    thread = lab.event("stopped")["body"]["threadId"]
    names = {t["id"]: t["name"] for t in lab.request("threads")["body"]["threads"]}
    assert names[thread].startswith("worker2: "), names
    frame = lab.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (source, 6), frame
    assert lab.locals_of(frame)["x"] == "5"
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "15"
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[])["success"]


def test_a_member_without_the_cells_file_gets_its_source_with_the_breakpoints(lab):
    source = lab.request("dumpCell", code=G)["body"]["sourcePath"]
    Path(source).unlink()  # as on another host: no copy of the notebook's cell files there
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 2}])["success"]
    assert Path(source).read_text() == G  # written back by the members, from the driver's copy
    _, reply = execute(lab.client, G)
    assert reply["status"] == "ok", reply
    cell = lab.client.execute('rpc.rpc_sync("worker1", g, args=(7,))')
    thread = lab.event("stopped")["body"]["threadId"]
    frame = lab.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (source, 2), frame
    assert lab.locals_of(frame)["x"] == "7"
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "14"
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[])["success"]


def test_two_members_paused_at_once_are_two_threads(lab):
    cell = lab.client.execute('[fut.wait() for fut in [rpc.rpc_async("worker1", f, args=(1,)), '
                              'rpc.rpc_async("worker2", f, args=(2,))]]')
    first, second = lab.event("stopped")["body"]["threadId"], lab.event("stopped")["body"]["threadId"]
    assert first != second
    names = {t["id"]: t["name"] for t in lab.request("threads")["body"]["threads"]}
    assert {names[first].split(":")[0], names[second].split(":")[0]} == {"worker1", "worker2"}
    xs = {names[t].split(":")[0]: lab.locals_of(lab.top_frame(t))["x"] for t in (first, second)}
    assert xs == {"worker1": "1", "worker2": "2"}
    for thread in (first, second):
        assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "[4, 6]"


def test_a_breakpoint_in_an_rpc_on_cell_stops_on_its_member_at_the_cells_line(lab):
    source = lab.request("dumpCell", code=RPC_ON_CELL)["body"]["sourcePath"]
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 3}])["success"]
    cell = lab.client.execute(RPC_ON_CELL)
    thread = lab.event("stopped")["body"]["threadId"]
    names = {t["id"]: t["name"] for t in lab.request("threads")["body"]["threads"]}
    assert names[thread].startswith("worker2: "), names
    frame = lab.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (source, 3), frame
    here = lab.request("evaluate", expression="z + 1", frameId=frame["id"], context="repl")
    assert here["body"]["result"] == "6", here
    assert lab.request("continue", threadId=thread)["success"]
    printed = "".join(m["content"].get("text", "") for m in lab.idle(cell) if m["msg_type"] == "stream")
    assert "w is 15" in printed
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[])["success"]


def test_the_drivers_own_breakpoints_keep_working(lab):
    cell = lab.client.execute("f(6)")
    stopped = lab.event("stopped")
    thread = stopped["body"]["threadId"]
    names = {t["id"]: t["name"] for t in lab.request("threads")["body"]["threads"]}
    assert not names[thread].startswith(("worker1: ", "worker2: ")), names
    frame = lab.top_frame(thread)
    assert (frame["source"]["path"], frame["line"]) == (lab.source, 2)
    assert lab.locals_of(frame)["x"] == "6"
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "14"


def test_a_continue_for_the_drivers_thread_resumes_the_stopped_member(lab):
    # JupyterLab's Continue names thread 1 once it dropped the stopped thread from its model;
    # DAP's continue resumes every thread, the members' too.
    cell = lab.client.execute('rpc.rpc_sync("worker2", f, args=(2,))')
    thread = _stops_in_f(lab, "worker2", 2)
    assert lab.request("continue", threadId=1)["success"]
    assert cell_value(lab.idle(cell)) == "6"
    assert thread not in lab.request("debugInfo")["body"]["stoppedThreads"]


def test_a_member_stopped_in_the_debugger_is_paused_not_a_hang(lab):
    default = 'rpc.get_rpc_timeout(), rpc.rpc_sync("worker2", rpc.get_rpc_timeout)'
    _, reply = execute(lab.client, "pass", user_expressions={"t": default})
    assert reply["user_expressions"]["t"]["data"]["text/plain"] == "(0.0, 0.0)", reply  # none while debugging
    cell = lab.client.execute('rpc.rpc_sync("worker1", f, args=(3,), timeout=1)')
    thread = _stops_in_f(lab, "worker1", 3)
    # The waiting cell says so by itself, past the call's own timeout; so do the panel's rows.
    said = lab.shown(cell, r"paused in the debugger at cell \d+, line 2")
    assert "worker1 runs f, paused in the debugger" in said and "(not a hang)" in said, said
    assert "stuck" not in said, said
    rows = {r["name"]: r["state"] for r in lab.panel()["cluster"]["members"]}
    assert re.fullmatch(r"paused in the debugger at cell \d+, line 2", rows["worker1"]), rows
    assert rows["worker2"] == "running", rows
    time.sleep(1.5)  # more than the call's timeout again: a person steps, nothing fails
    assert lab.request("continue", threadId=thread)["success"]
    messages = lab.idle(cell)
    assert cell_value(messages) == "8", [m["content"] for m in messages]
    assert not [m for m in messages if m["msg_type"] == "error"]


def test_a_backward_pass_stops_in_the_cells_functions_on_the_member(lab):
    source = lab.request("dumpCell", code=BACKWARD)["body"]["sourcePath"]
    assert lab.request("setBreakpoints", source={"path": source},
                       breakpoints=[{"line": SCALED_LINE}, {"line": BACKWARD_LINE}])["success"]
    _, reply = execute(lab.client, BACKWARD)
    assert reply["status"] == "ok", reply
    # A function called inside an autograd Function whose forward rpc_sync ran on worker1.
    cell = lab.client.execute("with dist_autograd.context() as ctx:\n"
                              "    x = torch.ones(3, requires_grad=True)\n"
                              "    y = rpc.rpc_sync('worker1', twice, args=(x,))\n"
                              "    dist_autograd.backward(ctx, [(y * 5).sum()])\n"
                              "    grads = dist_autograd.get_gradients(ctx)[x].tolist()\n"
                              "grads")
    thread, _, found = stops_at(lab, "worker1", source, BACKWARD_LINE)
    assert found["grad"] == "tensor([5., 5., 5.])", found
    # The cell's backward waits on a paused member, not on a hang.
    said = lab.shown(cell, rf"dist_autograd.backward, paused in the debugger at cell \d+, line {BACKWARD_LINE}")
    assert "(not a hang)" in said and "stuck" not in said, said
    assert lab.request("continue", threadId=thread)["success"]
    thread, _, found = stops_at(lab, "worker1", source, SCALED_LINE)
    assert found["by"] == "2" and found["grad"] == "tensor([5., 5., 5.])", found
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "[10.0, 10.0, 10.0]"
    # A forward that remote ran on worker2, whose backward reaches worker2.
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": BACKWARD_LINE}])["success"]
    cell = lab.client.execute("module = rpc.remote('worker2', Doubler)\n"
                              "with dist_autograd.context() as ctx:\n"
                              "    x = torch.full((2,), 3.0, requires_grad=True)\n"
                              "    y = module.rpc_sync().forward(x)\n"
                              "    dist_autograd.backward(ctx, [(y * 7).sum()])\n"
                              "    grads = dist_autograd.get_gradients(ctx)[x].tolist()\n"
                              "grads")
    thread, frame, found = stops_at(lab, "worker2", source, BACKWARD_LINE)
    assert found["grad"] == "tensor([7., 7.])", found
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "[14.0, 14.0]"
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[])["success"]


def test_a_distributed_optimizer_step_stops_in_the_cells_optimizer_on_the_member(lab):
    source = lab.request("dumpCell", code=OPTIMIZER)["body"]["sourcePath"]
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": STEP_LINE}])["success"]
    _, reply = execute(lab.client, OPTIMIZER)
    assert reply["status"] == "ok", reply
    cell = lab.client.execute("weight = rpc.remote('worker1', new_weight)\n"
                              "optimizer = DistributedOptimizer(Plain, [weight], lr=0.5)\n"
                              "with dist_autograd.context() as ctx:\n"
                              "    dist_autograd.backward(ctx, [(weight.to_here() * 3).sum()])\n"
                              "    optimizer.step(ctx)\n"
                              "weight.to_here().tolist()")
    thread, _, found = stops_at(lab, "worker1", source, STEP_LINE)
    assert found["change"] == "tensor([1.5000, 1.5000])", found
    assert found["p"] == "tensor([1., 1.], requires_grad=True)", found
    assert lab.request("continue", threadId=thread)["success"]
    assert cell_value(lab.idle(cell)) == "[-0.5, -0.5]"
    assert lab.request("setBreakpoints", source={"path": source}, breakpoints=[])["success"]


def test_a_cell_a_member_cannot_write_at_the_drivers_path_is_held_in_memory():
    """A driver's cell path this host cannot make (a driver on another machine, another user's
    folder) keeps the cell's lines in linecache, under that path, for the debugger."""
    import linecache

    from nbrpc.member.lab_debugger import Cells

    cells, path = Cells(), "/proc/nbrpc-no-such-folder/cell.py"  # nothing can be made in /proc
    reply = cells.dump({"seq": 4}, path, G)
    assert (reply["success"], reply["body"], reply["request_seq"]) == (True, {"sourcePath": path}, 4)
    assert cells.held(path) and linecache.getline(path, 2) == "    twice = x * 2\n"
    frames = {"body": {"stackFrames": [{"source": {"path": path, "sourceReference": 3}},
                                       {"source": {"path": "/elsewhere.py", "sourceReference": 5}}]}}
    assert [f["source"]["sourceReference"] for f in cells.as_files(frames)["body"]["stackFrames"]] == [0, 5]
    linecache.cache.pop(path)
