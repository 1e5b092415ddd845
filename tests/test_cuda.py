"""CUDA RPC through nbrpc, on a machine with a GPU (marked ``gpu``: skipped elsewhere).

Each test runs a notebook in a fresh kernel: torch fixes a process's devices and
device maps at its first join, so every cluster here is its kernel's first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TUTORIAL = Path(__file__).parent.parent / "tutorials" / "06_cuda_rpc.ipynb"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def two_gpus():
    if gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs, torch sees {gpu_count()}")


def run_cells(tmp_path, *sources: str, timeout: float = 300) -> list[str]:
    """Run the cells in a fresh kernel; each cell's stdout (errors fail the test)."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    return ["".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
            for cell in notebook.cells]


def last_json(text: str):
    return json.loads(text.strip().splitlines()[-1])


SETUP = "%load_ext nbrpc\nimport json, torch\nimport torch.distributed.rpc as rpc\nimport nbrpc"


def test_direct_round_trip_and_reply_on_the_callers_device(tmp_path):
    out = run_cells(
        tmp_path, SETUP, "%rpc_init -n 2 --gpus",
        "def where(t):\n    return str(t.device), t + 1\n"
        "x = torch.arange(4.0, device='cuda:0')\n"
        "seen, y = rpc.rpc_sync('worker1', where, args=(x,))\n"
        "print(json.dumps([seen, str(y.device), y.tolist(), torch.cuda.device_count()]))",
        # worker1 calls the driver: the reply map the driver needs was installed by nbrpc
        "%%rpc_on worker1\nimport json, torch\nimport torch.distributed.rpc as rpc\n"
        "here = torch.device('cuda', 1 % torch.cuda.device_count())\n"
        "def where(t):\n    return str(t.device), t * 2\n"
        "seen, y = rpc.rpc_sync('master', where, args=(torch.ones(3, device=here),))\n"
        "print(json.dumps([str(here), seen, str(y.device), y.tolist()]))",
        "print(json.dumps({r['name']: r['devices'] for r in nbrpc.current().status()}))",
        "%rpc_shutdown",
    )
    seen, device, values, count = last_json(out[2])
    home = 1 % count
    assert seen == f"cuda:{home}" and device == "cuda:0" and values == [1.0, 2.0, 3.0, 4.0]
    here, seen, device, values = last_json(out[3].replace("[worker1] ", ""))
    assert seen == "cuda:0" and device == here == f"cuda:{home}" and values == [2.0, 2.0, 2.0]
    shown = last_json(out[4])
    assert shown["master"] == ",".join(f"cuda:{i}" for i in range(count))
    assert shown["worker1"] == f"cuda:{home}" and shown["worker2"] == f"cuda:{2 % count}"


def test_worker_to_worker_maps(tmp_path):
    out = run_cells(
        tmp_path, SETUP, "%rpc_init -n 2 --gpus",
        "%%rpc_on worker1\nimport json, torch\nimport torch.distributed.rpc as rpc\n"
        "n = torch.cuda.device_count()\n"
        "def where(t):\n    return str(t.device), t + 10\n"
        "x = torch.zeros(2, device=f'cuda:{1 % n}')\n"
        "seen, y = rpc.rpc_sync('worker2', where, args=(x,))\n"
        "print(json.dumps([seen, str(y.device), y.tolist(), n]))",
        "%rpc_shutdown",
    )
    seen, device, values, n = last_json(out[2].replace("[worker1] ", ""))
    assert seen == f"cuda:{2 % n}" and device == f"cuda:{1 % n}" and values == [10.0, 10.0]


def test_a_later_cluster_needing_other_maps_asks_for_a_restart(tmp_path):
    out = run_cells(
        tmp_path, SETUP, "%rpc_init -n 1 --gpus", "%rpc_shutdown",
        "try:\n    get_ipython().run_line_magic('rpc_init', '--names ps --gpus')\n"
        "except Exception as e:\n    print(type(e).__name__, e)",
        # the same names and --gpus again: fine
        "%rpc_init -n 1 --gpus", "%rpc_shutdown",
    )
    # cells: 0 setup, 1-2 the first cluster, 3 the refused one, 4-5 the same names again.
    # On one GPU every map is {0: 0}, but the driver's maps are fixed at its first join,
    # and it joined with maps toward worker1 ... worker64 only: none toward ps.
    assert out[3].startswith("UsageError %rpc_init: this kernel joined RPC with devices")
    assert "device maps toward ps" in out[3] and "Restart the kernel" in out[3]
    assert "master + worker1 up in" in out[4]


RECIPE = '''
import torch
import torch.distributed.autograd as autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn

import os
import time


class MyModule(nn.Module):
    def __init__(self, device, comm_mode):
        super().__init__()
        self.device = device
        self.linear = nn.Linear(1000, 1000).to(device)
        self.relu = nn.ReLU()
        self.comm_mode = comm_mode

    def forward(self, x):
        # x.to() is a no-op if x is already on self.device
        y = self.relu(self.linear(x.to(self.device)))
        return y.cpu() if self.comm_mode == "cpu" else y

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


def measure(comm_mode):
    # local module on "worker0/cuda:0"
    lm = MyModule("cuda:0", comm_mode)
    # remote module on "worker1/cuda:1"
    rm = rpc.remote("worker1", MyModule, args=("cuda:1", comm_mode))
    # prepare random inputs
    x = torch.randn(1000, 1000).cuda(0)

    tik = time.time()
    for _ in range(10):
        with autograd.context() as ctx:
            y = rm.rpc_sync().forward(lm(x))
            autograd.backward(ctx, [y.sum()])
    # synchronize on "cuda:0" to make sure that all pending CUDA ops are
    # included in the measurements
    torch.cuda.current_stream("cuda:0").synchronize()
    tok = time.time()
    print(f"{comm_mode} RPC total execution time: {tok - tik}")
'''


def test_cuda_rpc_recipe_runs_both_modes(tmp_path, record_property):
    """PyTorch's CUDA RPC recipe, its code unmodified; %rpc_init replaces mp.spawn/init_rpc.

    RRefs to a module on a GPU worker, distributed autograd through CUDA tensors."""
    two_gpus()
    out = run_cells(
        tmp_path, "%load_ext nbrpc",
        '%rpc_init --names worker1 --driver-name worker0 --threads 128 --device-map "worker1=0:1"',
        RECIPE, 'measure(comm_mode="cpu")\nmeasure(comm_mode="cuda")', "%rpc_shutdown",
    )
    times = dict(re.findall(r"(cpu|cuda) RPC total execution time: ([0-9.]+)", out[3]))
    assert set(times) == {"cpu", "cuda"}, out[3]
    cpu, cuda = float(times["cpu"]), float(times["cuda"])
    assert cpu > 0 and cuda > 0
    record_property("recipe_seconds", {"cpu": cpu, "cuda": cuda, "speedup": cpu / cuda})
    print(f"recipe: cpu {cpu:.3f} s, cuda {cuda:.3f} s, speed-up {cpu / cuda:.1f}x")


def test_tutorial_06_runs_the_direct_path(tmp_path):
    notebook = nbformat.read(TUTORIAL, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = ["".join(o.get("text", "") for o in c.get("outputs", []) if o.output_type == "stream")
             for c in notebook.cells if c.cell_type == "code"]
    assert any("ran the staged and the direct path" in t for t in texts), texts
    assert any("CUDA is available" in t for t in texts)
