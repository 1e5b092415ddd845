"""JupyterLab's debugger across hosts: a member on another host, for real.

The driver kernel (an ipykernel with nbrpc) runs on host ``drv``; a worker joins it from
host ``w1`` with ``nbrpc worker --join``; each host is a network namespace (``netns``).
The member's host does not see the driver's cell files: there, the driver's temporary
folder, where the driver's ipykernel dumps the cells JupyterLab sends it, is an empty
folder of its own (a tmpfs mounted over it in the worker's mount namespace), writable or
not (as a laptop's temporary folder's path is not, on a Linux server). The test
reaches the driver kernel over Unix sockets (the ipc transport), the one way into its
namespace from here, and speaks the debug adapter protocol to it as JupyterLab does.

They need root and iproute2; elsewhere they skip, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import netns
import pytest
from conftest import execute, wait_gone
from dap import Dap, cell_value, stops_at
from netns import Network, Process

REASON = netns.unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

G = "def g(x):\n    twice = x * 2\n    return twice\n"
START = 180.0
# Runs the command after its two arguments with the folder named second hidden, in a mount
# namespace of its own: an empty tmpfs there, mounted with the options named first.
HIDE_FOLDER = 'mount -t tmpfs -o "$1" nbrpc-elsewhere "$2" && shift 2 && exec "$@"'
WRITABLE = {"writable": "mode=0700", "read-only": "ro,mode=0700"}


@pytest.fixture
def network():
    net = Network(["drv", "w1"])
    try:
        yield net.up()
    finally:
        net.down()


@pytest.fixture
def driver_kernel(network, pids, tmp_path):
    """An ipykernel on host ``drv``, its temporary folder its own; a ``Dap`` on its client."""
    from jupyter_client import BlockingKernelClient
    from jupyter_client.connect import write_connection_file

    cells_folder = tmp_path / "drv-tmp"
    cells_folder.mkdir()
    sockets = tempfile.mkdtemp(prefix="dap-kernel-", dir="/tmp")  # short: a Unix socket's path
    connection_file, _ = write_connection_file(str(tmp_path / "kernel.json"), transport="ipc",
                                               ip=os.path.join(sockets, "kernel"))
    kernel = Process(network, "drv", ["env", f"TMPDIR={cells_folder}", sys.executable, "-m",
                                      "ipykernel_launcher", "-f", connection_file],
                     pids, tmp_path / "driver-kernel.log")
    client = BlockingKernelClient(connection_file=connection_file)
    client.load_connection_file()
    client.start_channels(hb=False)  # on a loaded machine the heartbeat may lag: "Kernel died" when alive
    try:
        client.wait_for_ready(timeout=120)
        dap = Dap(client)
        dap.cells_folder, dap.kernel = cells_folder, kernel
        yield dap
        client.shutdown()
        assert kernel.proc.wait(timeout=30) == 0, kernel.output()[-3000:]
    finally:
        client.stop_channels()
        kernel.end()
        shutil.rmtree(sockets, ignore_errors=True)
        print(f"--- the driver kernel (pid {kernel.pid})\n{kernel.output()[-4000:]}")


def _join(dap: Dap, network: Network, pids, folder, mount: str) -> Process:
    """``%rpc_init --attach 1`` on the driver, and a worker named trainer joining from w1,
    where the driver's temporary folder is an empty tmpfs mounted with ``mount``."""
    cell = dap.client.execute(f"%rpc_init --attach 1 --bind {network.address['drv']} --timeout 60 "
                              f"--startup-timeout {START:g}")
    said = dap.shown(cell, r"nbrpc worker --join \S+ --token \S+", START)
    address, token = re.search(r"nbrpc worker --join (\S+) --token (\S+)", said).groups()
    own_tmp = folder / "w1-tmp"
    own_tmp.mkdir()
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDE_FOLDER, "hide", mount,
              str(dap.cells_folder)]
    worker = Process(network, "w1", [*hidden, "env", f"TMPDIR={own_tmp}", sys.executable, "-m", "nbrpc.cli",
                                     "worker", "--join", address, "--token", token, "--name", "trainer"],
                     pids, folder / "worker.log")
    messages = dap.idle(cell, START)
    assert not [m for m in messages if m["msg_type"] == "error"], [m["content"] for m in messages]
    return worker


def _as_seen_by(pid: int, path: str) -> Path:
    """``path`` in the files that process ``pid`` sees (its mount namespace)."""
    return Path(f"/proc/{pid}/root{path}")


@pytest.mark.parametrize("there", WRITABLE)
def test_a_member_on_another_host_stops_at_the_drivers_cell(driver_kernel, network, pids, tmp_path, there):
    """The member's host has no copy of the driver's cell files: it writes the cell's source
    sent with the breakpoints at the driver's path, or, where it cannot write there, holds it
    in memory; either way it stops at the driver's cell and line."""
    dap = driver_kernel
    _, reply = execute(dap.client, "%load_ext nbrpc\nimport os\nimport nbrpc\nimport torch.distributed.rpc as rpc",
                       timeout=240)
    assert reply["status"] == "ok", reply
    worker = _join(dap, network, pids, tmp_path, WRITABLE[there])
    try:
        _, reply = execute(dap.client, "pass", user_expressions={
            "w": "[(w.name, w.ip, w.pid) for w in nbrpc.current().workers]"})
        assert reply["user_expressions"]["w"]["data"]["text/plain"] == str(
            [("trainer", network.address["w1"], worker.pid)]), reply

        # JupyterLab switches its debugger on for the notebook: the member joins it.
        assert dap.request("initialize", clientID="jupyterlab", adapterID="python", pathFormat="path",
                           linesStartAt1=True, columnsStartAt1=True, supportsVariableType=True,
                           locale="en")["success"]
        assert dap.request("attach")["success"]
        source = dap.request("dumpCell", code=G)["body"]["sourcePath"]
        assert source.startswith(f"{dap.cells_folder}/") and Path(source).read_text() == G
        assert not _as_seen_by(worker.pid, source).exists()  # the member's host has no copy
        breakpoints = dap.request("setBreakpoints", source={"path": source}, breakpoints=[{"line": 2}],
                                  sourceModified=False)
        assert breakpoints["success"] and breakpoints["body"]["breakpoints"][0]["verified"], breakpoints
        if there == "writable":
            assert _as_seen_by(worker.pid, source).read_text() == G  # sent with the breakpoints
        else:
            assert not _as_seen_by(worker.pid, source).exists()
        assert dap.request("configurationDone")["success"]

        _, reply = execute(dap.client, G)
        assert reply["status"] == "ok", reply
        cell = dap.client.execute('rpc.rpc_sync("trainer", g, args=(7,))')
        thread, frame, found = stops_at(dap, "trainer", source, 2, timeout=120)
        assert found["x"] == "7", found
        assert frame["source"].get("sourceReference", 0) == 0, frame  # the driver's file, as its own
        here = dap.request("evaluate", expression="__import__('os').getpid()", frameId=frame["id"],
                           context="repl")
        assert here["success"] and here["body"]["result"] == str(worker.pid), here
        assert dap.request("continue", threadId=thread)["success"]
        assert cell_value(dap.idle(cell)) == "14"

        dap.request("disconnect", restart=False, terminateDebuggee=False)
        execute(dap.client, "%rpc_shutdown", timeout=120)
        assert worker.proc.wait(timeout=30) == 0
    finally:
        print(f"--- the worker (pid {worker.pid})\n{worker.output()[-4000:]}")
        worker.end()
    assert not wait_gone([worker.pid], 10)
