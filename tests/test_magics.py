"""The magics, run the way a user runs them: in an IPython shell, a real kernel, a notebook.

The shell tests share one cluster started by ``%rpc_init`` and ended by a test of
``%rpc_shutdown``; the next test starts a second one, as a user does after a shutdown.
The kernel and notebook tests each start a one-worker cluster inside a real ipykernel.
"""

from __future__ import annotations

import io
import os
import sys
import time

import nbformat
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import execute, run, streamed, wait_gone, wait_until
from nbclient import NotebookClient

import nbrpc
from nbrpc._util import pid_alive
from nbrpc.group import membership
from nbrpc.kernel_ext.magics import RpcMagics


class Recorder(io.StringIO):
    """A stdout that remembers when each piece of text arrived."""

    def __init__(self):
        super().__init__()
        self.writes: list[tuple[float, str]] = []

    def write(self, text):
        self.writes.append((time.monotonic(), text))
        return super().write(text)

    def arrival(self, needle: str) -> float:
        return next(t for t, text in self.writes if needle in text)


@pytest.fixture(scope="module")
def started(ip):
    """The cluster ``%rpc_init -n 2 --threads 8 --timeout 30`` started in the shell."""
    assert nbrpc.current() is None
    ip.run_line_magic("rpc_init", "-n 2 --threads 8 --timeout 30")
    cluster = nbrpc.current()
    pids = [w.pid for w in cluster.workers]
    yield cluster
    if nbrpc.current() is not None:
        ip.run_line_magic("rpc_shutdown", "")
    assert not wait_gone(pids)


# -- %rpc_init and the standard API ------------------------------------------------


def test_rpc_init_options_reach_every_member(started):
    assert [w.name for w in started.workers] == ["worker1", "worker2"]
    assert all(w.state == "running" and pid_alive(w.pid) for w in started.workers)
    assert rpc.get_rpc_timeout() == 30
    # The driver's agent, and so its thread pool, lives as long as its process.
    assert int(rpc._get_debug_info()["agent.thread_pool_size"]) == started._driver.threads
    for name in ("worker1", "worker2"):
        assert rpc.rpc_sync(name, rpc.get_rpc_timeout) == 30
        assert int(rpc.rpc_sync(name, rpc._get_debug_info)["agent.thread_pool_size"]) == 8


def test_standard_api_works_in_cells(ip, started):
    run(ip, """
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc

def add(a, b):
    return a + b

summed = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
added = rpc.rpc_async("worker2", add, args=(torch.ones(2), torch.ones(2))).wait()
ones_rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
fetched = ones_rref.to_here()

with dist_autograd.context() as context_id:
    t1 = torch.rand((3, 3), requires_grad=True)
    t2 = torch.rand((3, 3), requires_grad=True)
    loss = rpc.rpc_sync("worker2", add, args=(t1, t2)).sum()
    dist_autograd.backward(context_id, [loss])
    grads = dist_autograd.get_gradients(context_id)
""")
    ns = ip.user_ns
    assert torch.equal(ns["summed"], torch.tensor([4.0, 4.0]))
    assert torch.equal(ns["added"], torch.tensor([2.0, 2.0]))
    assert ns["ones_rref"].owner().name == "worker1"
    assert torch.equal(ns["fetched"], torch.full((2,), 2.0))
    assert torch.equal(ns["grads"][ns["t1"]], torch.ones(3, 3))
    assert torch.equal(ns["grads"][ns["t2"]], torch.ones(3, 3))


# -- %%rpc_on ----------------------------------------------------------------------


def test_rpc_on_streams_tagged_output_as_it_happens(ip, started, monkeypatch):
    out = Recorder()
    monkeypatch.setattr(sys, "stdout", out)
    pid = next(w.pid for w in started.workers if w.name == "worker1")
    began = time.monotonic()
    cell = "import os, time\nprint('first', os.getpid())\ntime.sleep(1.5)\nprint('second')"
    ip.run_cell_magic("rpc_on", "worker1", cell)
    ended = time.monotonic()
    assert out.getvalue() == f"[worker1] first {pid}\n[worker1] second\n"
    # the first line was shown while the worker was still sleeping
    assert out.arrival("first") < ended - 1.0
    assert out.arrival("second") - out.arrival("first") > 1.0
    assert ended - began < 10


def test_rpc_on_stderr_is_tagged_too(ip, started, capsys):
    cell = "import sys\nprint('careful', file=sys.stderr)\nprint('fine')"
    ip.run_cell_magic("rpc_on", "worker2", cell)
    captured = capsys.readouterr()
    assert captured.out == "[worker2] fine\n"
    assert captured.err == "[worker2] careful\n"


def test_rpc_on_all_and_a_list(ip, started, capsys):
    cell = "import torch.distributed.rpc as rpc\nprint('I am', rpc.get_worker_info().name)"
    for targets in ("all", "worker1,worker2"):
        ip.run_cell_magic("rpc_on", targets, cell)
        lines = sorted(capsys.readouterr().out.splitlines())
        assert lines == ["[worker1] I am worker1", "[worker2] I am worker2"]
    ip.run_cell_magic("rpc_on", "worker2", cell)
    assert capsys.readouterr().out == "[worker2] I am worker2\n"


def test_rpc_on_cell_calls_back_into_the_driver(ip, started, capsys):
    # While this cell runs the driver's kernel is busy; its RPC threads still answer.
    cell = (
        "import os\nimport torch.distributed.rpc as rpc\n"
        "print('driver pid', rpc.rpc_sync('master', os.getpid))"
    )
    ip.run_cell_magic("rpc_on", "worker1", cell)
    assert capsys.readouterr().out == f"[worker1] driver pid {os.getpid()}\n"


def test_rpc_on_definitions_are_visible_to_rpc(ip, started):
    ip.run_cell_magic("rpc_on", "worker2", "def triple(x):\n    return 3 * x")
    result = run(ip, """
rpc.rpc_sync("worker2", lambda x: __import__("__main__").triple(x), args=(torch.ones(2),))
""")
    assert torch.equal(result, torch.full((2,), 3.0))


def test_rpc_on_remote_error_raises_with_worker_and_traceback(ip, started, capsys):
    cell = "def explode():\n    raise ZeroDivisionError('no way')\nexplode()"
    with pytest.raises(nbrpc.RemoteError) as info:
        ip.run_cell_magic("rpc_on", "worker2", cell)
    assert str(info.value) == "code raised on worker2: ZeroDivisionError: no way"
    assert "explode" in "\n".join(info.value.failures["worker2"][2])

    # As a cell: the shell shows the worker's name and its traceback, and the cell fails.
    result = ip.run_cell("%%rpc_on worker2\n" + cell, store_history=False)
    assert isinstance(result.error_in_exec, nbrpc.RemoteError)
    shown = capsys.readouterr().out
    assert "[worker2]" in shown and "ZeroDivisionError" in shown and "explode" in shown


def test_rpc_on_all_with_one_failure(ip, started, capsys):
    cell = (
        "import torch.distributed.rpc as rpc\n"
        "if rpc.get_worker_info().name == 'worker2':\n"
        "    raise ValueError('only here')\n"
        "print('fine')"
    )
    with pytest.raises(nbrpc.RemoteError) as info:
        ip.run_cell_magic("rpc_on", "all", cell)
    assert list(info.value.failures) == ["worker2"]
    assert capsys.readouterr().out == "[worker1] fine\n"


# -- %rpc_status -------------------------------------------------------------------


def test_rpc_status_table(ip, started):
    def rows():
        text = repr(ip.run_line_magic("rpc_status", ""))
        header, *lines = text.splitlines()
        assert header.split() == ["name", "rank", "host", "pid", "state", "devices", "busy", "owned_rrefs"]
        return {cells[0]: cells for cells in (line.split() for line in lines)}

    before = rows()
    assert before["master"][1:6] == ["0", started.workers[0].host, str(os.getpid()), "driver", "cpu"]
    for w in started.workers:
        row = before[w.name]
        assert row[1:7] == [str(w.rank), w.host, str(w.pid), "running", "cpu", "0"]
        assert w.rank == rpc.get_worker_info(w.name).id > 0
        assert pid_alive(int(row[3]))
    assert set(before) == {"master", "worker1", "worker2"}

    held = rpc.remote("worker2", torch.add, args=(torch.zeros(3), 1))
    held.to_here()
    after = rows()
    assert int(after["worker2"][7]) == int(before["worker2"][7]) + 1

    html = ip.run_line_magic("rpc_status", "")._repr_html_()
    assert html.startswith('<table class="nbrpc-status">') and html.endswith("</table>")
    assert html.count("<tr>") == 4  # header + 3 members
    for w in started.workers:
        assert f"<td>{w.name}</td>" in html and f"<td>{w.pid}</td>" in html
    assert html.count("<td>running</td>") == 2


def test_rpc_init_help(ip, capsys):
    doc = RpcMagics.rpc_init.__doc__
    for option in ("-n N", "--names NAMES", "--driver-name DRIVER_NAME", "--threads THREADS",
                   "--timeout TIMEOUT"):
        assert option in doc
    run(ip, "%rpc_init?")
    shown = capsys.readouterr().out
    assert "--threads THREADS" in shown and "TensorPipe worker threads" in shown
    assert "worker name, comma-separated names (a,b), or all" in RpcMagics.rpc_on.__doc__


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("line, says", [
    ("-n 2 --gpus", "--gpus needs CUDA"),
    ('-n 2 --device-map "worker1=0:1"', "a device map needs CUDA"),
    ('-n 2 --device-map "worker9=0:1"', "names 'worker9', which is not a member of this cluster"),
    ("-n 2 --device-map worker1=0", "cannot read '0' in device map 'worker1=0'"),
    ('-n 2 --device-map "worker1=0:1,1:1"', "sends both cuda:0 and cuda:1 to cuda:1"),
    # the flag repeats: the second map is read too
    ('-n 2 --device-map "worker1=0:1" --device-map "worker2->ps=0:0"', "names 'ps'"),
])
def test_rpc_init_gpu_options_refused_here_before_anything_starts(ip, started, line, says):
    from IPython.core.error import UsageError

    running = nbrpc.current()
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("rpc_init", line)
    assert str(info.value).startswith("%rpc_init: ") and says in str(info.value)
    assert nbrpc.current() is running


def test_rpc_shutdown_ends_workers(ip, started, capsys):
    pids = [w.pid for w in started.workers]
    ip.run_line_magic("rpc_shutdown", "")
    assert capsys.readouterr().out == "nbrpc: master + worker1, worker2 shut down\n"
    assert nbrpc.current() is None
    # The driver stays in RPC for the life of its process, alone.
    assert membership.member_names() == ["master"]
    assert not wait_gone(pids)
    assert [w.state for w in started.workers] == ["stopped", "stopped"]
    with pytest.raises(nbrpc.NoClusterError):
        ip.run_line_magic("rpc_status", "")
    ip.run_line_magic("rpc_shutdown", "")
    assert capsys.readouterr().out == "nbrpc: no cluster is running\n"


def test_rrefs_work_in_a_later_cluster(ip):
    """After ``%rpc_shutdown``, RRefs of the next ``%rpc_init`` know their owner and get freed."""
    assert nbrpc.current() is None  # the cluster of the tests above has ended
    ip.run_line_magic("rpc_init", "--names ps")
    cluster = nbrpc.current()
    try:

        def owned() -> int:
            return int(rpc.rpc_sync("ps", rpc._get_debug_info)["num_owner_rrefs"])

        before = owned()
        rref = rpc.remote("ps", torch.add, args=(torch.zeros(2), 1))
        assert torch.equal(rref.to_here(), torch.ones(2))
        assert owned() == before + 1
        assert rref.owner().name == "ps"
        assert rref.owner_name() == "ps"
        del rref  # the owner hears of it and drops its value
        assert wait_until(lambda: owned() == before, 5)
    finally:
        pids = [w.pid for w in cluster.workers]
        ip.run_line_magic("rpc_shutdown", "")
        assert not wait_gone(pids)


# -- a real kernel -----------------------------------------------------------------


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_real_kernel_shows_worker_output_rich_output_and_errors(kernel):
    _, kernel = kernel
    for code in ("%load_ext nbrpc", "%rpc_init -n 1"):
        _, reply = execute(kernel, code)
        assert reply["status"] == "ok", reply
    _, reply = execute(kernel, "", user_expressions={
        "pids": "[w.pid for w in __import__('nbrpc').current().workers]"})
    (pid,) = eval(reply["user_expressions"]["pids"]["data"]["text/plain"])
    assert pid_alive(pid)

    messages, reply = execute(kernel, (
        "%%rpc_on worker1\n"
        "from IPython.display import HTML, display\n"
        "print('before')\n"
        "display(HTML('<b>rich</b>'))\n"
        "HTML('<i>last</i>')"
    ))
    assert reply["status"] == "ok", reply
    assert streamed(messages) == "[worker1] before\n"
    shown = [m["content"]["data"] for m in messages if m["msg_type"] == "display_data"]
    assert [d.get("text/html") for d in shown] == ["<b>rich</b>", "<i>last</i>"]

    cell = "%%rpc_on worker1\ndef explode():\n    raise ZeroDivisionError('no way')\nexplode()"
    messages, reply = execute(kernel, cell)
    assert reply["status"] == "error"
    assert reply["ename"] == "RemoteError"
    traceback = "\n".join(reply["traceback"])
    assert "[worker1]" in traceback and "explode" in traceback and "no way" in traceback
    assert [m["msg_type"] for m in messages if m["msg_type"] == "error"] == ["error"]

    messages, reply = execute(kernel, "%rpc_shutdown")
    assert reply["status"] == "ok", reply
    assert streamed(messages) == "nbrpc: master + worker1 shut down\n"
    assert not wait_gone([pid])


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_load_ext_warms_the_template_for_the_first_cluster(kernel):
    _, kernel = kernel
    def value(expression: str):
        _, reply = execute(kernel, "", user_expressions={"v": expression})
        return eval(reply["user_expressions"]["v"]["data"]["text/plain"])

    template = "__import__('nbrpc.launchers.template', fromlist=['current']).current()"
    for code in ("import os\nos.environ['NBRPC_WARM_START'] = '0'", "%load_ext nbrpc"):
        assert execute(kernel, code)[1]["status"] == "ok"
    assert value(f"{template} is None")  # turned off: nothing started
    for code in ("del os.environ['NBRPC_WARM_START']", "%reload_ext nbrpc"):
        assert execute(kernel, code)[1]["status"] == "ok"
    assert value(f"{template}.wait_ready(60)")
    pid = value(f"{template}.pid")
    assert execute(kernel, "%rpc_init -n 1")[1]["status"] == "ok"
    assert value(f"{template}.pid") == pid  # the cluster forked from the warmed one
    worker = value("__import__('nbrpc').current().workers[0].pid")
    assert execute(kernel, "%rpc_shutdown")[1]["status"] == "ok"
    assert not wait_gone([worker])


# -- a real notebook ---------------------------------------------------------------


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_notebook_with_magics_runs_through_nbclient(tmp_path):
    sources = [
        "%load_ext nbrpc",
        "%rpc_init -n 1",
        "import torch\nimport torch.distributed.rpc as rpc\nscale = 3\n"
        "rpc.rpc_sync('worker1', lambda x: x * scale, args=(torch.tensor([1.0, 2.0]),))",
        "%%rpc_on worker1\nimport torch.distributed.rpc as rpc\n"
        "print('hello from', rpc.get_worker_info().name)",
        "%rpc_status",
        "%rpc_shutdown",
        "import nbrpc\nnbrpc.current() is None",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [cell.outputs for cell in notebook.cells]

    def text(cell_outputs, kind="stream"):
        return "".join(o.get("text", "") for o in cell_outputs if o.output_type == kind)

    def result(cell_outputs, mime="text/plain"):
        (data,) = [o.data for o in cell_outputs if o.output_type == "execute_result"]
        return data[mime]

    assert not [o for cell in outputs for o in cell if o.output_type == "error"]
    assert "nbrpc: master + worker1 up in" in text(outputs[1])
    assert result(outputs[2]) == "tensor([3., 6.])"
    assert text(outputs[3]) == "[worker1] hello from worker1\n"
    status = result(outputs[4])
    assert "worker1" in status and "running" in status
    assert "<td>worker1</td>" in result(outputs[4], "text/html")
    pid = int(status.splitlines()[2].split()[3])
    assert text(outputs[5]) == "nbrpc: master + worker1 shut down\n"
    assert result(outputs[6]) == "True"
    assert not wait_gone([pid])


def test_a_trailing_comment_is_not_an_argument(ip):
    """A magic's line reads as a script's line: ``# ...`` after it is a comment (the docs
    write magics that way), a ``#`` inside quotes or a word is not."""
    from IPython.core.error import UsageError

    from nbrpc.kernel_ext.magics import _without_comment

    assert _without_comment("-n 2  # driver + worker1, worker2") == "-n 2"
    assert _without_comment('--device-map "worker1=0:1" --ssh "ssh -F a#b"') == (
        '--device-map "worker1=0:1" --ssh "ssh -F a#b"')
    assert _without_comment("--names a#b,c  # two") == "--names a#b,c"
    assert _without_comment("# only a comment") == ""
    with pytest.raises(UsageError):
        ip.run_line_magic("rpc_shutdown", "now  # an argument it does not take")
