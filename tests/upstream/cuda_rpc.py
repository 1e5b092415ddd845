# Upstream: pytorch/tutorials, recipes_source/cuda_rpc.rst, "Direct Device-to-Device Communication
# with TensorPipe CUDA RPC", commit 4a23d9729d642158f381a36a16404b3807d33745.
#
# Changes, all in process start-up and device placement:
# - mp.spawn + run_worker's init_rpc (MASTER_ADDR/PORT, TensorPipeRpcBackendOptions with
#   num_worker_threads=128 and, on worker0, set_device_map("worker1", {0: 1})) -> %load_ext nbrpc
#   and %rpc_init --names worker1 --driver-name worker0 --threads 128
#   --device-map "worker1=0:{REMOTE_GPU}": worker0, which measures, is the notebook's kernel and
#   worker1 a worker kernel; rank 0's measure() calls are the driver cell; rpc.shutdown() is
#   %rpc_shutdown.
# - The remote module's GPU, REMOTE_GPU: with two GPUs the recipe's own, cuda:1 (map 0 -> 1); with
#   one GPU cuda:0, so both processes share it and the map is 0 -> 0 (TensorPipe's CUDA IPC channel
#   between the processes). measure()'s rpc.remote(..., args=("cuda:1", ...)) reads
#   f"cuda:{REMOTE_GPU}"; the recipe's comment on it says so.
# Everything else, prints included, is the recipe's code.

# %%
%load_ext nbrpc

# %%
# The remote module's GPU: the recipe's cuda:1 where there are two GPUs, else cuda:0.
import torch

REMOTE_GPU = 1 if torch.cuda.device_count() > 1 else 0

# %%
%rpc_init --names worker1 --driver-name worker0 --threads 128 --device-map "worker1=0:{REMOTE_GPU}"

# %%
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
        self.comm_mode = comm_mode

    def forward(self, x):
        # x.to() is a no-op if x is already on self.device
        y = self.linear(x.to(self.device))
        return y.cpu() if self.comm_mode == "cpu" else y

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]


def measure(comm_mode):
    # local module on "worker0/cuda:0"
    lm = MyModule("cuda:0", comm_mode)
    # remote module on "worker1/cuda:1" (cuda:0 with one GPU)
    rm = rpc.remote("worker1", MyModule, args=(f"cuda:{REMOTE_GPU}", comm_mode))
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

# %%
# rank 0 of run_worker: worker0
measure(comm_mode="cpu")
measure(comm_mode="cuda")

# %%
%rpc_shutdown
