"""Ship notebook definitions over torch RPC by value.

torch pickles RPC calls and results with ``pickle.Pickler`` (``torch_compat.torch_pickler``),
which stores functions and classes by reference: a worker has no notebook
``__main__``, so it fails with "Can't get attribute ... on <module '__main__'>", and
lambdas fail outright. ``RpcPickler`` is a cloudpickle pickler (everything importable
stays by reference) that keeps torch's dispatch table, so tensors still go to torch's
tensor table and RRefs fork; definitions from ``__main__`` travel as ``definitions``
describes, so they land in each process as a script's would.

Every pickle a member sends starts with a MAC of its bytes under the cluster's key
(``set_key``; the driver makes one, its workers get it with their settings), and
``rpc_unpickler`` refuses a message without a valid one before unpickling anything:
TensorPipe and the store accept connections from any local user, and an RPC pickle
runs code in the receiver. The MAC is keyed BLAKE2b, which is built into Python:
HMAC-SHA256 through OpenSSL 3 looks its digest up by name on every call, which cost
more than the rest of a small call's pickling.
"""

from __future__ import annotations

import collections
import copyreg
import hashlib
import hmac
import io
import pickle
import types
import weakref

import cloudpickle
import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ..errors import SerializationError
from ..recording import recorder, rref_ledger
from . import definitions, module_globals, shared_tensors

_C_DISPATCH_TABLE = pickle.Pickler.__dict__["dispatch_table"]
# cloudpickle rebuilds bound methods from their function, by value when the
# function's qualname does not resolve (classmethods such as torch's tensor
# receiver); pickle's own reduction, getattr(owner, name), keeps them by reference.
_BY_REFERENCE = {types.MethodType: types.MethodType.__reduce__}
# Functions and classes found to pickle by reference (importable by name).
_importable: weakref.WeakSet = weakref.WeakSet()


class _Signing:
    """This process's signing key (None: unsigned) and its last flattened dispatch table."""

    def __init__(self):
        self.key: bytes | None = None
        self.flat: tuple | None = None  # (what it was built from, the table)


_wire = _Signing()


_SIGNED = b"nbrpc-blake2b:"
_MAC_SIZE = 32


def set_key(key: bytes | None) -> None:
    """Sign what this process sends, and accept only what is signed, with ``key``
    (at most 64 bytes)."""
    _wire.key = key


def _mac(body) -> bytes:
    return hashlib.blake2b(body, key=_wire.key, digest_size=_MAC_SIZE).digest()


class RpcPickler(cloudpickle.Pickler):
    """cloudpickle with torch's reducers for tensors and RRefs in front; signs what it writes."""

    _shares_tensors = True  # big tensors to local members through shared memory

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
        shared = shared_tensors.is_enabled() and torch.Tensor in table and self._shares_tensors
        key = (type(self), table, len(table), rref_ledger.is_tracking(), len(copyreg.dispatch_table), shared)
        if _wire.flat is None or _wire.flat[0] != key:
            # Big tensors between local members through shared memory, the rest as torch sends them.
            big = {torch.Tensor: shared_tensors.reducer(table[torch.Tensor])} if shared else {}
            maps = (big, self._rref_reducers(), table, _BY_REFERENCE, cloudpickle.Pickler.dispatch_table)
            _wire.flat = (key, dict(collections.ChainMap(*maps)))
        return _wire.flat[1]

    def _rref_reducers(self) -> dict:
        # In front of torch's: the receiver of an RRef records the fork.
        return rref_ledger.reducer_table()

    def reducer_override(self, obj):
        # cloudpickle reduces only functions and classes itself; every other object
        # takes the dispatch table. An importable one is remembered, since the check
        # walks modules and the same few (torch's PythonUDF, the call's function) come
        # in every message. torch's API and nbrpc's replacements go by name (see
        # torch_compat.stand_in), before anything else decides.
        at_point = torch_compat.stand_in(obj)
        if at_point is not None:
            return getattr, at_point
        if isinstance(obj, types.FunctionType):
            if obj in _importable:
                return NotImplemented
            if definitions.is_notebook_definition(obj):
                return definitions.reduce_function(obj)
        elif isinstance(obj, type):
            if obj in _importable:
                return NotImplemented
            if definitions.is_notebook_definition(obj):
                return definitions.reduce_class(obj)
        else:
            held = module_globals.find(obj)
            if held is not None:  # a module's global: the receiver's own (see module_globals)
                return getattr, held
            return NotImplemented
        reduced = super().reducer_override(obj)
        if reduced is NotImplemented:  # pickled by reference
            _importable.add(obj)
        elif isinstance(obj, types.FunctionType):
            # by value, unless a module's object keeps it (sys.stdout.write while a
            # kernel's cell runs): then the receiver's (see module_globals)
            held = module_globals.find_attribute(obj)
            if held is not None:
                return getattr, held
        return reduced

    def dump(self, obj):
        try:
            with shared_tensors.pickling():
                super().dump(obj)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise SerializationError(_explain(obj, e)) from e
        body = self._body.getbuffer()
        if _wire.key is not None:
            self._out.write(_SIGNED + _mac(body))
        self._out.write(body)
        if recorder.RECORDER.armed:
            recorder.count(obj, self._out.tell())


def rpc_unpickler(file: io.BytesIO, **kwargs) -> pickle.Unpickler:
    """torch's unpickler for ``file``, once its signature is checked (when this process
    has a key): a function rather than a subclass, so that loading stays all in C."""
    if _wire.key is not None:
        header = file.read(len(_SIGNED) + _MAC_SIZE)
        if not (header.startswith(_SIGNED)
                and hmac.compare_digest(header[len(_SIGNED):], _mac(file.getbuffer()[len(header):]))):
            raise pickle.UnpicklingError(
                "nbrpc refused an RPC message not signed with this cluster's key: it "
                "comes from a process outside the cluster")
    if recorder.RECORDER.fetches:  # a recorded to_here's reply
        recorder.received(len(file.getbuffer()))
    return pickle.Unpickler(file, **kwargs)


def _explain(obj, error: Exception) -> str:
    """Name the argument or value that failed to pickle, and what to do instead."""
    if isinstance(obj, torch_compat.PythonUDF):
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
    """Pickles to learn whether a value can be sent, never forking an RRef nor taking
    a shared memory segment."""

    _shares_tensors = False

    def _rref_reducers(self) -> dict:
        return {}


def _stub(_):
    return type(None), ()


def install() -> None:
    """Make torch RPC in this process use ``RpcPickler`` and ``rpc_unpickler`` (idempotent)."""
    torch_compat.patch(torch_compat.PICKLER, RpcPickler)
    torch_compat.patch(torch_compat.UNPICKLER, rpc_unpickler)
