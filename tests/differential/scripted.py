"""The TorchScript functions of the differential check. torch finds a ``ScriptFunction``
by its qualified name in the callee's compilation unit, so, as torch's docstrings say
("On both workers"), this runs on every member: imported by each raw torch process, run
as a cell on every member of the nbrpc cluster."""

import torch
import torch.distributed.rpc as rpc
from torch import Tensor
from torch.futures import Future


@torch.jit.script
def script_receive(write: int, xs: list[Tensor]) -> list[Tensor]:
    if write >= 0 and write < len(xs):
        xs[write].fill_(7)
    return xs


@rpc.functions.async_execution
@torch.jit.script
def async_script_receive(to: str, write: int, xs: list[Tensor]) -> Future[list[Tensor]]:
    return rpc.rpc_async(to, script_receive, (write, xs))


# torch.distributed.rpc.functions.async_execution's docstring, and rpc_sync's / remote's.
# The first two renamed (docs_): a kernel compiles a TorchScript function of a name it
# compiled before under a mangled name, sent under a stand-in's name that torch's texts
# show, and tests/test_call_kinds.py runs the docstring's own in the driver's __main__
# (conformance/DIFFERENCES.md)
@torch.jit.script
def docs_script_add(x: Tensor, y: Tensor) -> Tensor:
    return x + y


@rpc.functions.async_execution
@torch.jit.script
def docs_async_add(to: str, x: Tensor, y: Tensor) -> Future[Tensor]:
    return rpc.rpc_async(to, docs_script_add, (x, y))


@torch.jit.script
def my_script_add(tensor: torch.Tensor, scalar: int):
    return torch.add(tensor, scalar)
