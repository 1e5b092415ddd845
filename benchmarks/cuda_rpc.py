"""PyTorch's CUDA RPC recipe through nbrpc: ``measure("cpu")`` against ``measure("cuda")``.

The recipe ("Direct Device-to-Device Communication with TensorPipe CUDA RPC") as
published, with its ``mp.spawn`` / ``init_rpc`` boilerplate replaced by
``nbrpc.Cluster(names=["worker1"], driver_name="worker0", device_maps={"worker1": {0: R}})``.
Two layouts: with two GPUs the recipe's own (worker0 on cuda:0, worker1 on cuda:1, map
0 -> 1); with one GPU both processes on cuda:0 (map 0 -> 0, TensorPipe's CUDA IPC
channel between processes), the remote module's device the one change to the recipe.
Without a GPU it says why it did not run and exits 0. Writes ``build/bench_cuda.json``
with the layout it measured.

    python benchmarks/cuda_rpc.py [ROUNDS]
"""

import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed.autograd as autograd
import torch.distributed.rpc as rpc
import torch.nn as nn

import nbrpc

REPORT = Path(__file__).resolve().parent.parent / "build" / "bench_cuda.json"


# -- the recipe, unmodified -----------------------------------------------------------


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


def measure(comm_mode, remote_device="cuda:1"):
    # local module on "worker0/cuda:0"
    lm = MyModule("cuda:0", comm_mode)
    # remote module on "worker1/cuda:1" (cuda:0 with one GPU)
    rm = rpc.remote("worker1", MyModule, args=(remote_device, comm_mode))
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
    return tok - tik  # the one addition: the time, for the report


# -- the run ------------------------------------------------------------------------


def main(rounds: int = 3) -> int:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 1:
        print("skipped: the recipe needs a GPU and torch sees none "
              f"(torch.cuda.is_available() is {torch.cuda.is_available()})")
        return 0
    remote = 1 if count >= 2 else 0
    layout = (f"worker0 on cuda:0, worker1 on cuda:{remote}, device map 0 -> {remote}"
              + ("" if remote else " (one GPU: both processes on it, CUDA IPC between them)"))
    print(f"layout: {layout}")
    times = {"cpu": [], "cuda": []}
    with nbrpc.Cluster(names=["worker1"], driver_name="worker0", threads=128,
                       device_maps={"worker1": {0: remote}}):
        measure("cuda", f"cuda:{remote}")  # warm-up: CUDA contexts, channels, kernels
        for _ in range(rounds):  # the modes take turns
            for mode in times:
                times[mode].append(measure(mode, f"cuda:{remote}"))
    best = {mode: min(values) for mode, values in times.items()}
    print(f"best of {rounds}: cpu {best['cpu']:.3f} s, cuda {best['cuda']:.3f} s, "
          f"speed-up {best['cpu'] / best['cuda']:.1f}x on {torch.cuda.get_device_name(0)}")
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps({
        "device": torch.cuda.get_device_name(0), "gpus": count, "layout": layout, "host": platform.node(),
        "torch": torch.__version__, "seconds": times, "speedup": best["cpu"] / best["cuda"],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:])))
