"""torch's RPC API, however a notebook holds it, travels by reference: each process
that receives ``remote``, ``rpc_sync``, an RRef method or ``dist_autograd.backward``
gets its own, patched by nbrpc or not, as a script importing torch would."""

from __future__ import annotations

import ast

from conftest import cell_text, execute_cells

# Each form a notebook may hold torch's API in, as {label: (object, what it stands for)}.
FORMS = '''
import functools
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.rpc import remote, rpc_async, rpc_sync

alias = rpc.remote

class Holder:
    call = rpc_sync

def by_default(call=rpc_async):
    return call

forms = {
    "from-import, before nbrpc patched it": (early_remote, "remote"),
    "from-import": (remote, "remote"),
    "rpc_sync": (rpc_sync, "rpc_sync"),
    "rpc.rpc_async": (rpc.rpc_async, "rpc_async"),
    "rpc.api.remote": (rpc.api.remote, "remote"),
    "an alias": (alias, "remote"),
    "a class attribute": (Holder, "rpc_sync"),
    "a default argument": (by_default, "rpc_async"),
    "a functools.partial": (functools.partial(rpc_sync, "nowhere"), "rpc_sync"),
    "an RRef method": (rpc.PyRRef.to_here, "to_here"),
    "dist_autograd.backward": (dist_autograd.backward, "backward"),
}

def lands_as_own(forms):
    """Which forms arrived as this process's own object."""
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc.api as api
    from torch._C._distributed_rpc import PyRRef
    own = {"remote": api.remote, "rpc_sync": api.rpc_sync, "rpc_async": api.rpc_async,
           "to_here": PyRRef.to_here, "backward": dist_autograd.backward}
    def unwrap(obj):
        if isinstance(obj, functools.partial):
            return obj.func
        if isinstance(obj, type):
            return obj.call
        if getattr(obj, "__name__", None) == "by_default":
            return obj()
        return obj
    return sorted(label for label, (obj, kind) in forms.items() if unwrap(obj) is not own[kind])
'''

# pytorch/examples distributed/rpc/rl/main.py's pattern: torch's `remote`, imported by
# name, called inside a class that a cell defines and the worker constructs.
AGENT = '''
class Agent:
    def __init__(self, world_size):
        self.ob_rrefs = [remote(f"worker{r}", Observer) for r in range(1, world_size)]

    def ids(self):
        return [rpc_sync(ob.owner(), call_where, args=(ob,)) for ob in self.ob_rrefs]

def call_where(rref):
    return rref.local_value().where()

class Observer:
    def __init__(self):
        self.id = rpc.get_worker_info().id

    def where(self):
        return self.id

agent = rpc.remote("worker1", Agent, args=(3,))
agent.rpc_sync().ids()
'''


def test_torch_api_lands_as_the_receivers_own_both_ways(tmp_path):
    sources = [
        "%load_ext nbrpc",
        # held before %rpc_init patched torch: torch's own function, whose name now
        # leads to nbrpc's
        "from torch.distributed.rpc import remote as early_remote",
        "%rpc_init -n 2",
        FORMS,
        "rpc.rpc_sync('worker1', lands_as_own, args=(forms,))",
        # worker to driver: the worker's own forms, torch's original among them
        "%%rpc_on worker1\nfrom nbrpc._compat import torch_compat\n"
        "early_remote = torch_compat._originals[(torch_compat.api, 'remote')]\n" + FORMS
        + "\nprint(rpc.rpc_sync('master', lands_as_own, args=(forms,)))",
        AGENT,
        "%rpc_shutdown",
    ]
    notebook = execute_cells(tmp_path, sources)
    # every form was the receiver's own object, in both directions
    assert ast.literal_eval(cell_text(notebook.cells[4], "execute_result")) == []
    assert cell_text(notebook.cells[5]) == "[worker1] []\n"
    # the upstream pattern runs: worker1's Agent made Observers on worker1 and worker2
    assert ast.literal_eval(cell_text(notebook.cells[6], "execute_result")) == [1, 2]
