"""Ship notebook definitions over torch RPC by value.

torch pickles RPC calls and results with ``pickle.Pickler`` (``rpc.internal._pickler``),
which stores functions and classes by reference: a worker has no notebook
``__main__``, so it fails with "Can't get attribute ... on <module '__main__'>", and
lambdas fail outright. ``RpcPickler`` is a cloudpickle pickler (everything importable
stays by reference) that keeps torch's dispatch table, so tensors still go to torch's
tensor table and RRefs fork; definitions from ``__main__`` travel as ``definitions``
describes, so they land in each process as a script's would.

Every pickle a member sends starts with an HMAC of its bytes under the cluster's key
(``set_key``; the driver makes one, its workers get it with their settings), and
``RpcUnpickler`` refuses a message without a valid one before unpickling anything:
TensorPipe and the store accept connections from any local user, and an RPC pickle
runs code in the receiver.
"""

from __future__ import annotations

import collections
import copyreg
import hmac
import io
import pickle
import types
import weakref

import cloudpickle
import torch
import torch.distributed.rpc as rpc
from torch.distributed.rpc import internal

from . import definitions, rrefs, tracing
from .errors import SerializationError

_C_DISPATCH_TABLE = pickle.Pickler.__dict__["dispatch_table"]
# cloudpickle rebuilds bound methods from their function, by value when the
# function's qualname does not resolve (classmethods such as torch's tensor
# receiver); pickle's own reduction, getattr(owner, name), keeps them by reference.
_BY_REFERENCE = {types.MethodType: types.MethodType.__reduce__}
# Functions found to pickle by reference (importable by name): the check walks modules.
_importable: weakref.WeakSet = weakref.WeakSet()
# The last flattened dispatch table, with what it was built from.
_flat: tuple | None = None


_SIGNED = b"nbrpc-hmac-sha256:"
_key: bytes | None = None


def set_key(key: bytes) -> None:
    """Sign what this process sends, and accept only what is signed, with ``key``."""
    global _key
    _key = key


class RpcPickler(cloudpickle.Pickler):
    """cloudpickle with torch's reducers for tensors and RRefs in front; signs what it writes."""

    def __init__(self, file, protocol=None, buffer_callback=None):
        self._out, self._body = file, io.BytesIO()
        super().__init__(self._body, protocol, buffer_callback)

    @property
    def dispatch_table(self):
        return self._torch_table

    @dispatch_table.setter
    def dispatch_table(self, table):
        # torch assigns its table after construction and then adds to it; the C
        # pickler reads its own slot, so point that slot at all the tables, flattened
        # into one dict: the C pickler looks every object's type up there, and a miss
        # in a ChainMap costs a Python-level KeyError each time.
        self._torch_table = table
        _C_DISPATCH_TABLE.__set__(self, self._flat_table(table))

    def _flat_table(self, table) -> dict:
        global _flat
        key = (type(self), table, len(table), rrefs.is_tracking(), len(copyreg.dispatch_table))
        if _flat is None or any(a is not b and a != b for a, b in zip(_flat[0], key)):
            maps = (self._rref_reducers(), table, _BY_REFERENCE, cloudpickle.Pickler.dispatch_table)
            _flat = (key, dict(collections.ChainMap(*maps)))
        return _flat[1]

    def _rref_reducers(self) -> dict:
        # In front of torch's: the receiver of an RRef records the fork.
        return rrefs.reducer_table()

    def reducer_override(self, obj):
        if isinstance(obj, types.FunctionType):
            if obj in _importable:
                return NotImplemented
            if definitions.is_notebook_definition(obj):
                return definitions.reduce_function(obj)
            reduced = super().reducer_override(obj)
            if reduced is NotImplemented:  # pickled by reference: remember, it is asked often
                _importable.add(obj)
            return reduced
        if isinstance(obj, type) and definitions.is_notebook_definition(obj):
            return definitions.reduce_class(obj)
        return super().reducer_override(obj)

    def dump(self, obj):
        try:
            super().dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SerializationError(_explain(obj, e)) from e
        body = self._body.getbuffer()
        if _key is not None:
            self._out.write(_SIGNED + hmac.digest(_key, body, "sha256"))
        self._out.write(body)
        if tracing.armed:
            tracing.count(obj, self._out.tell())


class RpcUnpickler(pickle.Unpickler):
    """Unpickles only messages signed with this cluster's key (when it has one)."""

    def __init__(self, file, **kwargs):
        self._in = file
        super().__init__(file, **kwargs)

    def load(self):
        if _key is not None:
            header = self._in.read(len(_SIGNED) + 32)
            body = self._in.getbuffer()[len(header):]
            signature = header[len(_SIGNED):]
            if not (header.startswith(_SIGNED)
                    and hmac.compare_digest(signature, hmac.digest(_key, body, "sha256"))):
                raise pickle.UnpicklingError(
                    "nbrpc refused an RPC message not signed with this cluster's key: it "
                    "comes from a process outside the cluster")
        if tracing.armed:
            tracing.received(len(self._in.getbuffer()))
        return super().load()


def _explain(obj, error: Exception) -> str:
    """Name the argument or value that failed to pickle, and what to do instead."""
    if isinstance(obj, internal.PythonUDF):
        func_name = getattr(obj.func, "__qualname__", type(obj.func).__name__)
        named = [(f"the function {func_name}", obj.func)]
        named += [(f"argument {i}", v) for i, v in enumerate(obj.args or ())]
        named += [(f"keyword argument {k!r}", v) for k, v in (obj.kwargs or {}).items()]
    else:
        named = [("the result", obj)]
    for _, value in named:
        culprit = definitions.unsendable_global(value, _pickles)
        if culprit:
            return (
                f"cannot send {culprit} over RPC: {error}. Define it on the workers instead "
                "(in a %%rpc_on all cell, or the body of %%rpc_init), so each process makes "
                "its own, as a script's import would."
            )
    what = next((f"{label} ({type(v).__name__})" for label, v in named if not _pickles(v)),
                "the call")
    return (
        f"cannot send {what} over RPC: {error}. Send data that pickles (tensors, numbers, "
        "containers, functions, modules), or create the object where it is used, e.g. "
        "with rpc.remote(worker, Class, args=...) and pass the RRef."
    )


def _pickles(value) -> bool:
    """Whether ``value`` pickles, with tensors and RRefs stubbed out (no side effects)."""
    pickler = _CheckPickler(io.BytesIO())
    pickler.dispatch_table = {t: _stub for t in (torch.Tensor, rpc.RRef, rpc.PyRRef)}
    try:
        cloudpickle.Pickler.dump(pickler, value)
    except Exception:
        return False
    return True


class _CheckPickler(RpcPickler):
    """Pickles to learn whether a value can be sent, never forking an RRef."""

    def _rref_reducers(self) -> dict:
        return {}


def _stub(_):
    return type(None), ()


def install() -> None:
    """Make torch RPC in this process use ``RpcPickler`` and ``RpcUnpickler`` (idempotent)."""
    internal._pickler = RpcPickler
    internal._unpickler = RpcUnpickler
