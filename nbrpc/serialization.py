"""Ship notebook definitions over torch RPC by value.

torch pickles RPC calls and results with ``pickle.Pickler`` (``rpc.internal._pickler``),
which stores functions and classes by reference: a worker has no notebook
``__main__``, so it fails with "Can't get attribute ... on <module '__main__'>", and
lambdas fail outright. ``RpcPickler`` is a cloudpickle pickler (definitions from
``__main__`` travel by value, everything importable stays by reference) that keeps
torch's dispatch table, so tensors still go to torch's tensor table and RRefs fork.
"""

from __future__ import annotations

import collections
import pickle
import types

import cloudpickle
from torch.distributed.rpc import internal

from .errors import SerializationError

_C_DISPATCH_TABLE = pickle.Pickler.__dict__["dispatch_table"]
# cloudpickle rebuilds bound methods from their function, by value when the
# function's qualname does not resolve (classmethods such as torch's tensor
# receiver); pickle's own reduction, getattr(owner, name), keeps them by reference.
_BY_REFERENCE = {types.MethodType: types.MethodType.__reduce__}


class RpcPickler(cloudpickle.Pickler):
    """cloudpickle with torch's reducers for tensors and RRefs in front."""

    @property
    def dispatch_table(self):
        return self._torch_table

    @dispatch_table.setter
    def dispatch_table(self, table):
        # torch assigns its table after construction and then adds to it; the C
        # pickler reads its own slot, so point that slot at both tables.
        self._torch_table = table
        _C_DISPATCH_TABLE.__set__(
            self, collections.ChainMap(table, _BY_REFERENCE, cloudpickle.Pickler.dispatch_table)
        )

    def dump(self, obj):
        try:
            return super().dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SerializationError(_explain(obj, e)) from e


def _explain(obj, error: Exception) -> str:
    """Name the argument or value that failed to pickle, and what to do instead."""
    what = "an RPC value"
    parts = getattr(obj, "args", None)
    if isinstance(parts, tuple):
        for index, arg in enumerate(parts):
            try:
                cloudpickle.dumps(arg)
            except Exception:
                what = f"argument {index} ({type(arg).__name__})"
                break
    return (
        f"cannot send {what} over RPC: {error}. Send data that pickles (tensors, numbers, "
        "containers, functions, modules), or create the object where it is used, e.g. "
        "with rpc.remote(worker, Class, args=...) and pass the RRef."
    )


def install() -> None:
    """Make torch RPC in this process use ``RpcPickler`` (idempotent)."""
    internal._pickler = RpcPickler
