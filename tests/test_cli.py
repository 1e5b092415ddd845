"""``nbrpc run``: a notebook executed headless, its kernel on Unix sockets and ended after."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import nbformat
import pytest
from conftest import kernel_pids, wait_gone


@pytest.mark.slow
def test_run_executes_a_notebook_over_unix_sockets_and_ends_its_kernel(tmp_path, pids):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("%load_ext nbrpc\n%rpc_init -n 1"),
        nbformat.v4.new_code_cell("import torch.distributed.rpc as rpc\n"
                                  "rpc.rpc_sync('worker1', lambda: 6 * 7)"),
        nbformat.v4.new_code_cell("from nbrpc.cluster.cluster import current\n"
                                  "print(current().workers[0].connection_file)"),
        nbformat.v4.new_code_cell("%rpc_shutdown"),
    ])
    source, output = tmp_path / "in.ipynb", tmp_path / "out" / "done.ipynb"
    nbformat.write(notebook, source)
    # A temporary folder of its own (other runs on the machine make folders meanwhile),
    # too deep for a kernel's Unix sockets: the worker's sockets go to /tmp.
    scratch = tmp_path / ("deep-" * 12) / "tmp"
    scratch.mkdir(parents=True)
    cli = subprocess.Popen([sys.executable, "-m", "nbrpc.cli", "run", str(source), "--output", str(output)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "TMPDIR": str(scratch)})
    pids.add(cli.pid)
    out, err = cli.communicate(timeout=240)
    assert cli.returncode == 0, err
    assert "executed notebook" in out + err
    assert "without encryption" not in err  # not on TCP
    done = nbformat.read(output, as_version=4)
    assert done.cells[1].outputs[0]["data"]["text/plain"] == "42"
    assert not glob.glob(f"{scratch}/nbrpc-*")  # its kernel's sockets
    worker_folder = os.path.dirname(done.cells[2].outputs[0]["text"].strip())
    assert worker_folder.startswith("/tmp/nbrpc-worker1-")
    assert not os.path.exists(worker_folder)
    assert not wait_gone(kernel_pids(), timeout=10)
