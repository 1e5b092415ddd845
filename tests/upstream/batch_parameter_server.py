# Upstream: pytorch/examples, distributed/rpc/batch/parameter_server.py,
# commit 77f55b912142e11fcfdf5b530231fb9c52f181e8.
# Also serves pytorch/tutorials intermediate_source/rpc_async_execution.rst, "Batch-Updating
# Parameter Server" (commit 23cb57fe7fa090fb669b28a13b8fe8a9229f84ac): the page shows this
# program's two classes (without the timed_log lines) and refers to the examples file for the rest.
#
# Changes:
# - mp.spawn + run(rank, world_size)'s init_rpc and rank dispatch -> %load_ext nbrpc and
#   %rpc_init --names trainer1,trainer2 --driver-name ps --threads 16 --timeout 300 (the
#   script's TensorPipeRpcBackendOptions, but 300 s: each round ships a ResNet50 to and from
#   every trainer, over a minute a round with 5 trainers on this loaded 2-core machine;
#   world size batch_update_size + 1). The PS is the
#   notebook's kernel; its branch, run_ps([...trainers]), is the driver cell; rpc.shutdown() is
#   %rpc_shutdown. run() also joins every rank to a gloo process group
#   (dist.init_process_group / destroy_process_group) that the program never uses: left out.
# - torchvision.models.resnet50 -> resnet50 from the cell `# include _torchvision_resnet.py`,
#   torchvision's own code (its PyPI wheels do not load with torch's CPU build).
# - No GPU here: every `.cuda()` -> `.to(device)`, with
#   device = torch.device("cuda" if torch.cuda.is_available() else "cpu"). The tensors it moves
#   are fresh (a batch, a model that came over RPC), so no copy is needed.
# - Scale: batch_size = 4, 32x32 images, num_batches = 2, batch_update_size = 2, so 2 trainers
#   (upstream 20, 64x64, 6 and 5 trainers; 5 trainers with 3 batches took 270 s here).
# Everything else, prints included, is the upstream code.

# %%
%load_ext nbrpc

# %%
%rpc_init --names trainer1,trainer2 --driver-name ps --threads 16 --timeout 300

# %%
# include _torchvision_resnet.py

# %%
import os
import threading
from datetime import datetime
import warnings

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
from torch import optim


# Suppress deprecated ProcessGroup warning
warnings.filterwarnings("ignore", message="You are using a Backend.*ProcessGroup")



batch_size = 4
image_w = 32
image_h = 32
num_classes = 30
batch_update_size = 2
num_batches = 2
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def timed_log(text):
    print(f"{datetime.now().strftime('%H:%M:%S')} {text}")


class BatchUpdateParameterServer(object):

    def __init__(self, batch_update_size=batch_update_size):
        self.model = resnet50(num_classes=num_classes)
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.001, momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        timed_log(f"PS got {self.curr_update_size}/{batch_update_size} updates")
        for p, g in zip(self.model.parameters(), grads):
            p.grad += g
        with self.lock:
            self.curr_update_size += 1
            fut = self.future_model

            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                timed_log("PS updated model")
                self.future_model = torch.futures.Future()

        return fut


class Trainer(object):

    def __init__(self, ps_rref):
        self.ps_rref = ps_rref
        self.loss_fn = nn.MSELoss()
        self.one_hot_indices = torch.LongTensor(batch_size) \
                                    .random_(0, num_classes) \
                                    .view(batch_size, 1)

    def get_next_batch(self):
        for _ in range(num_batches):
            inputs = torch.randn(batch_size, 3, image_w, image_h)
            labels = torch.zeros(batch_size, num_classes) \
                        .scatter_(1, self.one_hot_indices, 1)
            yield inputs.to(device), labels.to(device)

    def train(self):
        name = rpc.get_worker_info().name
        m = self.ps_rref.rpc_sync().get_model().to(device)
        for inputs, labels in self.get_next_batch():
            timed_log(f"{name} processing one batch")
            self.loss_fn(m(inputs), labels).backward()
            timed_log(f"{name} reporting grads")
            m = rpc.rpc_sync(
                self.ps_rref.owner(),
                BatchUpdateParameterServer.update_and_fetch_model,
                args=(self.ps_rref, [p.grad for p in m.cpu().parameters()]),
            ).to(device)
            timed_log(f"{name} got updated model")


def run_trainer(ps_rref):
    trainer = Trainer(ps_rref)
    trainer.train()


def run_ps(trainers):
    timed_log("Start training")
    ps_rref = rpc.RRef(BatchUpdateParameterServer())
    futs = []
    for trainer in trainers:
        futs.append(
            rpc.rpc_async(trainer, run_trainer, args=(ps_rref,))
        )

    torch.futures.wait_all(futs)
    timed_log("Finish training")



# %%
# rank 0 of run(): the parameter server
world_size = batch_update_size + 1
run_ps([f"trainer{r}" for r in range(1, world_size)])

# %%
%rpc_shutdown
