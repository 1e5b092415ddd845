"""A message's tensors sent beside its pickle, in torch's tensor table, as torch sends
them, under a receiver that costs less to write and to read.

torch's reducer appends a tensor to the message's table (``torch_compat.tensor_tables``)
and writes its classmethod ``_tensor_receiver`` in its place. The C pickler writes a
bound method as ``getattr(class, name)``: two globals looked up and imported, and the
method is a new object for every tensor, so pickle's memo never takes the second one;
and the receiving side runs that ``getattr`` for every tensor. That was about 2.5 us of a
one-tensor message's 7 on the sending side. ``receive`` is a module function: one global, written
once a message. The table, the tensors' order, and so what torch's agent does with them
(storages, views, device maps, distributed autograd's send functions), are torch's.
"""

from __future__ import annotations

from .._compat import rpc_pickler, torch_compat

_tables = torch_compat.tensor_tables


def receive(index: int):
    """On the receiver: the message's tensor ``index``, as torch's agent rebuilt it."""
    return _tables.recv_tables[index]


def _reduce(tensor):
    sent = _tables.send_tables
    sent.append(tensor)
    return receive, (len(sent) - 1,)


def reducer(torch_reducer):
    """The reducer for tensors in place of ``torch_reducer``, the one in torch's table:
    ``receive``'s if that is torch's own, else that one (a reducer registered for tensors)."""
    return _reduce if rpc_pickler.is_torch_tensor_reducer(torch_reducer) else torch_reducer
