"""CUDA RPC through nbrpc, on a machine with a GPU (marked ``gpu``: skipped elsewhere).

Each test runs a notebook in a fresh kernel: torch fixes a process's devices and
device maps at its first join, so every cluster here is its kernel's first.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TUTORIAL = Path(__file__).parent.parent / "tutorials" / "06_cuda_rpc.ipynb"


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


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


def test_tutorial_06_runs_the_direct_path(tmp_path):
    notebook = nbformat.read(TUTORIAL, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = ["".join(o.get("text", "") for o in c.get("outputs", []) if o.output_type == "stream")
             for c in notebook.cells if c.cell_type == "code"]
    assert any("ran the staged and the direct path" in t for t in texts), texts
    assert any("CUDA is available" in t for t in texts)


CUDA_FUTURES = '''
import json, torch
import torch.distributed.rpc as rpc
from nbrpc._compat import torch_compat

SLEEP = 200_000_000  # GPU cycles (about 0.1 s): long enough for a missing sync to show


def slow_ones(t):
    torch.cuda._sleep(SLEEP)
    return t.fill_(1)


@rpc.functions.async_execution
def nested_add(to, x, y, z):
    # torch's rpc_test.py async_cuda_nested_add: an @async_execution function returns
    # rpc_async(...).then(cb) on CUDA tensors
    def cb(fut):
        torch.cuda._sleep(SLEEP)
        return fut.value() + z

    return rpc.rpc_async(to, torch.add, args=(x, y)).then(cb)


def cuda_semantics(rpc_async):
    """What a future of rpc_async (nbrpc's or torch's) does with CUDA values, read on
    another stream than the default one."""
    x = torch.zeros(1000, device="cuda:0")
    fut = rpc_async("worker1", slow_ones, args=(x,))
    child = fut.then(lambda f: [torch.cuda.current_stream() != torch.cuda.default_stream(), f.value() * 2])
    a = b = c = torch.ones(1000, device="cuda:0")
    nested = rpc_async("worker1", nested_add, args=("worker2", a, b, c))
    with torch.cuda.stream(torch.cuda.Stream("cuda:0")):
        ones = fut.wait()
        on_pool_streams, doubled = child.wait()
        threes = nested.wait()
        return {"value": bool(torch.eq(ones, 1).all()), "callback on pool streams": on_pool_streams,
                "then": bool(torch.eq(doubled, 2).all()), "nested": bool(torch.eq(threes, 3).all())}
'''


def test_rpc_async_futures_keep_torchs_cuda_semantics(tmp_path):
    # nbrpc's rpc_async returns a NamedFuture: it, what its then() makes, and what an
    # @async_execution function returns from it must sync CUDA streams as torch's own do
    out = run_cells(
        tmp_path, SETUP, "%rpc_init -n 2 --gpus", CUDA_FUTURES,
        "print(json.dumps({'nbrpc': cuda_semantics(rpc.rpc_async), "
        "'torch': cuda_semantics(torch_compat.rpc_async)}))",
        "%rpc_shutdown",
    )
    seen = last_json(out[3])
    expected = {"value": True, "callback on pool streams": True, "then": True, "nested": True}
    assert seen["torch"] == expected, seen
    assert seen["nbrpc"] == expected, seen
