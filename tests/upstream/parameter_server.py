# Upstream: pytorch/examples, distributed/rpc/parameter_server/rpc_parameter_server.py,
# commit 77f55b912142e11fcfdf5b530231fb9c52f181e8.
# Also serves pytorch/tutorials intermediate_source/rpc_param_server_tutorial.rst
# (commit 0a7e68666de5faceafa90276ad2b7874cd32c5e0): the page walks through this same program
# (its device choice reads torch.cuda where the examples file reads torch.accelerator).
#
# Changes, all in process start-up and data:
# - The script is imported by every process: its module body (imports, Net, the helpers,
#   ParameterServer, get_parameter_server, TrainerNet, run_training_loop, get_accuracy) is the body
#   of %%rpc_init --names trainer_1,trainer_2 --driver-name parameter_server, which runs it on
#   every member, once RPC is up. The parameter server (rank 0) is the notebook's kernel; as
#   upstream, it runs no loop of its own.
# - run_parameter_server and run_worker (init_rpc, the training loop, shutdown) and the argparse
#   launcher with mp.Process: a %%rpc_on trainer_1,trainer_2 cell builds each trainer's data
#   loaders, then a %%rpc_on cell per trainer calls run_training_loop(rank, num_gpus, ...);
#   rpc.shutdown() is %rpc_shutdown. The start-up prints ("PS master initializing RPC",
#   "Worker rank N initializing RPC", ...) went with the start-up.
# - The trainers train one after the other, not at once: upstream's concurrent trainers race in
#   a script too (pytorch/examples#856): one trainer's optimizer step updates the shared weights
#   in place while the other's backward still needs them, and dist_autograd.backward fails with
#   "one of the variables needed for gradient computation has been modified by an inplace
#   operation" (seen here with both trainers in one %%rpc_on cell).
# - `from torchvision import datasets, transforms` and MNIST (a download) -> scikit-learn's
#   digits, shipped with the package: 8x8 images scaled to MNIST's 1x28x28 and normalized with
#   MNIST's (0.1307,), (0.3081,); 960 training and 320 test images, batch_size=32, shuffle=True.
# Everything else, prints included, is the upstream code.

# %%
%load_ext nbrpc

# %%
%%rpc_init --names trainer_1,trainer_2 --driver-name parameter_server
import argparse
import os
from threading import Lock

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.distributed.optim import DistributedOptimizer

# --------- MNIST Network to train, from pytorch/examples -----


class Net(nn.Module):
    def __init__(self, num_gpus=0):
        super(Net, self).__init__()
        print(f"Using {num_gpus} GPUs to train")
        self.num_gpus = num_gpus
        if torch.accelerator.is_available() and self.num_gpus > 0:
            acc = torch.accelerator.current_accelerator()
            device = torch.device(f'{acc}:0')
        else:
            device = torch.device("cpu")
        print(f"Putting first 2 convs on {str(device)}")
        # Put conv layers on the first accelerator device
        self.conv1 = nn.Conv2d(1, 32, 3, 1).to(device)
        self.conv2 = nn.Conv2d(32, 64, 3, 1).to(device)
        # Put rest of the network on the 2nd accelerator device, if there is one
        if torch.accelerator.is_available() and self.num_gpus > 0:
            acc = torch.accelerator.current_accelerator()
            device = torch.device(f'{acc}:1')

        print(f"Putting rest of layers on {str(device)}")
        self.dropout1 = nn.Dropout2d(0.25).to(device)
        self.dropout2 = nn.Dropout2d(0.5).to(device)
        self.fc1 = nn.Linear(9216, 128).to(device)
        self.fc2 = nn.Linear(128, 10).to(device)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)

        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        # Move tensor to next device if necessary
        next_device = next(self.fc1.parameters()).device
        x = x.to(next_device)

        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


# --------- Helper Methods --------------------

# On the local node, call a method with first arg as the value held by the
# RRef. Other args are passed in as arguments to the function called.
# Useful for calling instance methods.
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)

# Given an RRef, return the result of calling the passed in method on the value
# held by the RRef. This call is done on the remote node that owns
# the RRef. args and kwargs are passed into the method.
# Example: If the value held by the RRef is of type Foo, then
# remote_method(Foo.bar, rref, arg1, arg2) is equivalent to calling
# <foo_instance>.bar(arg1, arg2) on the remote node and getting the result
# back.

def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)

# --------- Parameter Server --------------------
class ParameterServer(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        model = Net(num_gpus=num_gpus)
        self.model = model
        if torch.accelerator.is_available() and num_gpus > 0:
            acc = torch.accelerator.current_accelerator()
            self.input_device = torch.device(f'{acc}:0')
        else:
            self.input_device = torch.device("cpu")
            
    def forward(self, inp):
        inp = inp.to(self.input_device)
        out = self.model(inp)
        # This output is forwarded over RPC, which as of 1.5.0 only accepts CPU tensors.
        # Tensors must be moved in and out of GPU memory due to this.
        out = out.to("cpu")
        return out

    # Use dist autograd to retrieve gradients accumulated for this model.
    # Primarily used for verification.
    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        # This output is forwarded over RPC, which as of 1.5.0 only accepts CPU tensors.
        # Tensors must be moved in and out of GPU memory due to this.
        cpu_grads = {}
        for k, v in grads.items():
            k_cpu, v_cpu = k.to("cpu"), v.to("cpu")
            cpu_grads[k_cpu] = v_cpu
        return cpu_grads

    # Wrap local parameters in a RRef. Needed for building the
    # DistributedOptimizer which optimizes parameters remotely.
    def get_param_rrefs(self):
        param_rrefs = [rpc.RRef(param) for param in self.model.parameters()]
        return param_rrefs

param_server = None
global_lock = Lock()

def get_parameter_server(num_gpus=0):
    global param_server
    # Ensure that we get only one handle to the ParameterServer.
    with global_lock:
        if not param_server:
            # construct it once
            param_server = ParameterServer(num_gpus=num_gpus)
        return param_server



# --------- Trainers --------------------

# nn.Module corresponding to the network trained by this trainer. The
# forward() method simply invokes the network on the given parameter
# server.
class TrainerNet(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.num_gpus = num_gpus
        self.param_server_rref = rpc.remote(
            "parameter_server", get_parameter_server, args=(num_gpus,))

    def get_global_param_rrefs(self):
        remote_params = remote_method(
            ParameterServer.get_param_rrefs,
            self.param_server_rref)
        return remote_params

    def forward(self, x):
        model_output = remote_method(
            ParameterServer.forward, self.param_server_rref, x)
        return model_output


def run_training_loop(rank, num_gpus, train_loader, test_loader):
    # Runs the typical neural network forward + backward + optimizer step, but
    # in a distributed fashion.
    net = TrainerNet(num_gpus=num_gpus)
    # Build DistributedOptimizer.
    param_rrefs = net.get_global_param_rrefs()
    opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=0.03)
    for i, (data, target) in enumerate(train_loader):
        with dist_autograd.context() as cid:
            model_output = net(data)
            target = target.to(model_output.device)
            loss = F.nll_loss(model_output, target)
            if i % 5 == 0:
                print(f"Rank {rank} training batch {i} loss {loss.item()}")
            dist_autograd.backward(cid, [loss])
            # Ensure that dist autograd ran successfully and gradients were
            # returned.
            assert remote_method(
                ParameterServer.get_dist_gradients,
                net.param_server_rref,
                cid) != {}
            opt.step(cid)

    print("Training complete!")
    print("Getting accuracy....")
    get_accuracy(test_loader, net)


def get_accuracy(test_loader, model):
    model.eval()
    correct_sum = 0
    # Use GPU to evaluate if possible
    if torch.accelerator.is_available() and model.num_gpus > 0:
        acc = torch.accelerator.current_accelerator()
        device = torch.device(f'{acc}:0')
    else:
        device = torch.device("cpu")
    with torch.no_grad():
        for i, (data, target) in enumerate(test_loader):
            out = model(data)
            pred = out.argmax(dim=1, keepdim=True)
            pred, target = pred.to(device), target.to(device)
            correct = pred.eq(target.view_as(pred)).sum().item()
            correct_sum += correct

    print(f"Accuracy {correct_sum / len(test_loader.dataset)}")



# %%
%%rpc_on trainer_1,trainer_2
# The launcher's trainer branch: data for this trainer, then run_worker's training loop.
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

digits = load_digits()
images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
images = (images - 0.1307) / 0.3081
labels = torch.tensor(digits.target)
train_loader = torch.utils.data.DataLoader(
    TensorDataset(images[:960], labels[:960]), batch_size=32, shuffle=True)
test_loader = torch.utils.data.DataLoader(
    TensorDataset(images[960:1280], labels[960:1280]), batch_size=32, shuffle=True)

rank = rpc.get_worker_info().id

# %%
%%rpc_on trainer_1
run_training_loop(rank, 0, train_loader, test_loader)

# %%
%%rpc_on trainer_2
run_training_loop(rank, 0, train_loader, test_loader)

# %%
%rpc_shutdown
