# Upstream: pytorch/examples, distributed/rpc/ddp_rpc/main.py,
# commit 77f55b912142e11fcfdf5b530231fb9c52f181e8.
# Also serves pytorch/tutorials advanced_source/rpc_ddp_tutorial.rst, "Combining Distributed
# DataParallel with Distributed RPC Framework" (commit 170df03d00dda8fb5067d405829acb2e68959d02):
# the page shows this same program, from its copy advanced_source/rpc_ddp_tutorial/main.py, which
# is the examples file before its accelerator edit (.cuda(device) with device_ids=[device], and
# backend="gloo" where the examples file asks torch.accelerator for the backend).
#
# Changes, all in process start-up, device and scale:
# - mp.spawn + run_worker's init_rpc and rank dispatch -> %load_ext nbrpc and
#   %rpc_init --names trainer0,trainer1,ps --driver-name master: the master is the notebook's
#   kernel (rank 0, upstream 2), trainer0, trainer1 and ps worker kernels (ranks 1, 2, 3;
#   upstream 0, 1, 3). A trainer's rank in the DDP group is the number in its name, as upstream.
# - The trainers' branch (init_process_group, then wait) is a %%rpc_on trainer0,trainer1 cell;
#   its init_method's port, upstream the fixed tcp://localhost:29500, is a free loopback port
#   below the ephemeral range (so no socket the cluster opens on port 0 takes it first) that a
#   driver cell picks before %rpc_init and puts in the environment as DDP_PORT, which the
#   worker kernels inherit. The master's branch is the driver cell; the ps's branch does nothing.
# - rpc.shutdown() then dist.destroy_process_group() on the trainers -> a %%rpc_on
#   trainer0,trainer1 cell that destroys the group (all RPCs are done: the master waited for
#   them), then %rpc_shutdown; the final print runs after it.
# - No GPU here, and the tutorial's backend, gloo: verify_min_gpu_count (which exits without two
#   GPUs) is gone, and the three `.to(rank)` (the trainer's GPU) -> `.to(DEVICE)`, DEVICE = "cpu".
# - Scale: `for epoch in range(100)` -> range(EPOCHS), EPOCHS = 10 (10 batches an epoch, as upstream).
# Everything else, prints included, is the upstream code.

# %%
%load_ext nbrpc

# %%
# The trainers' process group needs a port besides RPC's: a free one on loopback, in the
# environment that the worker kernels started next inherit. It lies below the range the OS
# hands to sockets bound to port 0, or the cluster's own sockets could take it before the
# trainers bind it.
import os
import random
import socket

with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
    first_ephemeral = int(f.read().split()[0])
for port in random.sample(range(first_ephemeral // 2, first_ephemeral), 200):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    os.environ["DDP_PORT"] = str(port)
    break

# %%
%rpc_init --names trainer0,trainer1,ps --driver-name master

# %%
import random

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.optim as optim
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef
from torch.distributed.rpc import TensorPipeRpcBackendOptions
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16
DEVICE = "cpu"
EPOCHS = 10

class HybridModel(torch.nn.Module):
    r"""
    The model consists of a sparse part and a dense part.
    1) The dense part is an nn.Linear module that is replicated across all trainers using DistributedDataParallel.
    2) The sparse part is a Remote Module that holds an nn.EmbeddingBag on the parameter server.
    This remote model can get a Remote Reference to the embedding table on the parameter server.
    """

    def __init__(self, remote_emb_module, rank):
        super(HybridModel, self).__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = DDP(torch.nn.Linear(16, 8).to(DEVICE))
        self.rank = rank

    def forward(self, indices, offsets):
        emb_lookup = self.remote_emb_module.forward(indices, offsets)
        return self.fc(emb_lookup.to(DEVICE))


def _run_trainer(remote_emb_module, rank):
    r"""
    Each trainer runs a forward pass which involves an embedding lookup on the
    parameter server and running nn.Linear locally. During the backward pass,
    DDP is responsible for aggregating the gradients for the dense part
    (nn.Linear) and distributed autograd ensures gradients updates are
    propagated to the parameter server.
    """

    # Setup the model.
    model = HybridModel(remote_emb_module, rank)

    # Retrieve all model parameters as rrefs for DistributedOptimizer.

    # Retrieve parameters for embedding table.
    model_parameter_rrefs = model.remote_emb_module.remote_parameters()

    # model.fc.parameters() only includes local parameters.
    # NOTE: Cannot call model.parameters() here,
    # because this will call remote_emb_module.parameters(),
    # which supports remote_parameters() but not parameters().
    for param in model.fc.parameters():
        model_parameter_rrefs.append(RRef(param))

    # Setup distributed optimizer
    opt = DistributedOptimizer(
        optim.SGD,
        model_parameter_rrefs,
        lr=0.05,
    )

    criterion = torch.nn.CrossEntropyLoss()

    def get_next_batch(rank):
        for _ in range(10):
            num_indices = random.randint(20, 50)
            indices = torch.LongTensor(num_indices).random_(0, NUM_EMBEDDINGS)

            # Generate offsets.
            offsets = []
            start = 0
            batch_size = 0
            while start < num_indices:
                offsets.append(start)
                start += random.randint(1, 10)
                batch_size += 1

            offsets_tensor = torch.LongTensor(offsets)
            target = torch.LongTensor(batch_size).random_(8).to(DEVICE)
            yield indices, offsets_tensor, target

    # Train for 100 epochs
    for epoch in range(EPOCHS):
        # create distributed autograd context
        for indices, offsets, target in get_next_batch(rank):
            with dist_autograd.context() as context_id:
                output = model(indices, offsets)
                loss = criterion(output, target)

                # Run distributed backward pass
                dist_autograd.backward(context_id, [loss])

                # Tun distributed optimizer
                opt.step(context_id)

                # Not necessary to zero grads as each iteration creates a different
                # distributed autograd context which hosts different grads
        print("Training done for epoch {}".format(epoch))

# %%
%%rpc_on trainer0,trainer1
# rank <= 1 of run_worker: the trainers
import os

import torch.distributed as dist
import torch.distributed.rpc as rpc

rank = int(rpc.get_worker_info().name.removeprefix("trainer"))
# Initialize process group for Distributed DataParallel on trainers.
dist.init_process_group(
    backend="gloo", rank=rank, world_size=2, init_method=f"tcp://localhost:{os.environ['DDP_PORT']}"
)

# Trainer just waits for RPCs from master.

# %%
# rank 2 of run_worker: the master
remote_emb_module = RemoteModule(
    "ps",
    torch.nn.EmbeddingBag,
    args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
    kwargs={"mode": "sum"},
)

# Run the training loop on trainers.
futs = []
for trainer_rank in [0, 1]:
    trainer_name = "trainer{}".format(trainer_rank)
    fut = rpc.rpc_async(
        trainer_name, _run_trainer, args=(remote_emb_module, trainer_rank)
    )
    futs.append(fut)

# Wait for all training to finish.
for fut in futs:
    fut.wait()

# %%
%%rpc_on trainer0,trainer1
# Clean up process group for trainers to avoid resource leaks
dist.destroy_process_group()

# %%
%rpc_shutdown

# %%
print("Distributed RPC example completed successfully.")
