"""torch's RPC pickler's private tables (``_InternalRPCPickler``), which nbrpc's
``serialize`` fills and reads as torch's own ``serialize`` does: its dispatch table, the
reducers registered with it, and its RRef and ScriptModule reducers. Known to work with
torch 2.11 to 2.15 (``tests/test_compat.py`` checks the names)."""

from __future__ import annotations

import torch.distributed.rpc as rpc
from torch.distributed.rpc import internal


def table_state(torch_pickler) -> tuple:
    """What torch's tables are now: the dispatch table (by identity), its size, and how
    many reducers are registered (a change in any means they must be put in again)."""
    table = torch_pickler._dispatch_table
    return table, len(table), len(torch_pickler._class_reducer_dict)


def prepared_table(torch_pickler, prepared: tuple | None) -> tuple[dict, tuple]:
    """torch's dispatch table with its RRef and registered reducers in, as torch's
    ``serialize`` puts them in each message's pickler; ``prepared`` is what this returned
    last (the table and the reducers' count), so that they are put in once per change."""
    table = torch_pickler._dispatch_table
    if prepared != (table, len(torch_pickler._class_reducer_dict)) or rpc.PyRRef not in table:
        table[rpc.PyRRef], table[rpc.RRef] = torch_pickler._py_rref_reducer, torch_pickler._rref_reducer
        table.update(torch_pickler._class_reducer_dict)
        prepared = (table, len(torch_pickler._class_reducer_dict))
    return table, prepared


def script_module_reducer(torch_pickler):
    """How torch pickles a ScriptModule in a message."""
    return torch_pickler._script_module_reducer


def is_torch_tensor_reducer(reducer) -> bool:
    """Whether ``reducer`` is torch's own for tensors (``_tensor_reducer``: the tensor into
    the message's table, ``_tensor_receiver`` written in its place), not one registered."""
    return getattr(reducer, "__func__", None) is internal._InternalRPCPickler._tensor_reducer
