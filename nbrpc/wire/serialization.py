"""Ship notebook definitions over torch RPC by value.

torch pickles RPC calls and results with ``pickle.Pickler`` (``torch_compat.torch_pickler``),
which stores functions and classes by reference: a worker has no notebook
``__main__``, so it fails with "Can't get attribute ... on <module '__main__'>", and
lambdas fail outright. ``RpcPickler`` is a cloudpickle pickler (everything importable
stays by reference) that keeps torch's dispatch table, so tensors still go to torch's
tensor table and RRefs fork; definitions from ``__main__`` travel as ``definitions``
describes, so they land in each process as a script's would. torch makes a pickler for every
message; each thread here keeps one (``serialize``), which pickles the same bytes.

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
import threading
import types

import cloudpickle
import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ..errors import SerializationError
from ..recording import recorder, rref_ledger
from . import c_pickling, definitions, module_globals, shared_tensors

_C_DISPATCH_TABLE = pickle.Pickler.__dict__["dispatch_table"]
_C_DUMP = pickle.Pickler.dump
# cloudpickle rebuilds bound methods from their function, by value when the
# function's qualname does not resolve (classmethods such as torch's tensor
# receiver); pickle's own reduction, getattr(owner, name), keeps them by reference.
_BY_REFERENCE = {types.MethodType: types.MethodType.__reduce__}
# Functions and classes found to pickle by reference (importable by name: their modules
# keep them alive anyway).
_importable: set = set()
# The types of what carries a Python function to its callee, added by the calls layer
# (``add_carrier``): tuples with the fields ``func``, ``call_id`` and ``trace``
# (``calls.interrupts.Carrier``), and ``carrying(func)``, the same call with another function.
CARRIERS: set = set()
# What ``reducer_override`` leaves as it is: torch's PythonUDF and the carriers.
_AS_THEY_ARE: set = {torch_compat.PythonUDF}


def _forget_importable() -> None:
    """Forget what was found importable once more objects stand at torch's patch points
    (``torch_compat.patch``): a function pickled by reference before nbrpc put it at one
    goes by that point's name from then on."""
    points = torch_compat.stand_in_count()
    if points != _wire.points:
        _importable.clear()
        _wire.points = points


def add_carrier(cls: type) -> None:
    """Instances of ``cls`` carry calls (see ``CARRIERS``): never a module's global, never by value."""
    CARRIERS.add(cls)
    _AS_THEY_ARE.add(cls)


class _WireState:
    """This process's signing key (None: unsigned), and what pickling keeps from one
    message to the next: the last flattened dispatch table, whether torch's table was
    made ready, how many objects stood at patch points."""

    def __init__(self):
        self.key: bytes | None = None
        self.flat: tuple | None = None  # (what it was built from, the table)
        # (torch's table, how many reducers were registered) when torch's RRef and
        # registered reducers were last put in it (``serialize``)
        self.prepared: tuple | None = None
        self.points = 0  # objects at torch's patch points when ``_importable`` was last checked


_wire = _WireState()


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
        # takes the dispatch table, unless it is a module's global. An importable one is
        # remembered, since the check walks modules and the same few (torch's PythonUDF,
        # the call's function) come in every message. torch's API and nbrpc's
        # replacements go by name (see torch_compat.stand_in), before anything else decides.
        # What carries every call (torch's PythonUDF, nbrpc's ``CARRIERS``) is none of these,
        # and an object found importable is no stand-in (see ``_forget_importable``).
        cls = type(obj)
        if cls in _AS_THEY_ARE:
            return NotImplemented
        is_function = cls is types.FunctionType
        is_class = not is_function and isinstance(obj, type)
        if (is_function or is_class) and obj in _importable:
            return NotImplemented
        at_point = torch_compat.stand_in(obj)
        if at_point is not None:
            return getattr, at_point
        if not (is_function or is_class):
            held = module_globals.find(obj)
            if held is not None:  # a module's global: the receiver's own (see module_globals)
                return getattr, held
            return NotImplemented
        if definitions.is_notebook_definition(obj):
            if not is_function:
                return definitions.reduce_class(obj)
            made = _kept.made  # made already for this message (``c_pickling.reduced_in_c``)
            reduction = made and made.pop(obj, None)
            return reduction or definitions.reduce_function(obj)
        reduced = super().reducer_override(obj)
        if reduced is NotImplemented:  # pickled by reference
            _importable.add(obj)
        elif is_function:
            # by value, unless a module's object keeps it (sys.stdout.write while a
            # kernel's cell runs): then the receiver's (see module_globals)
            held = module_globals.find_attribute(obj)
            if held is not None:
                return getattr, held
        return reduced

    def dump(self, obj):
        self._out.write(self.message(obj))

    def message(self, obj) -> bytes:
        """``obj`` pickled and signed. The pickler then forgets it (its memo holds what it
        pickled, and a value must not outlive its message here) and can pickle the next."""
        body = self._body
        try:
            with shared_tensors.PICKLING:
                _C_DUMP(self, obj)  # cloudpickle's dump adds only a word on deep recursion
            if _wire.key is None:
                payload = body.getvalue()
            else:
                with body.getbuffer() as view:
                    payload = b"".join((_SIGNED, _mac(view), view))
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
            raise SerializationError(_explain(obj, e)) from e
        finally:
            self.clear_memo()
            self.globals_ref = {}  # cloudpickle's, per pickle
            body.seek(0)
            body.truncate()
        if recorder.RECORDER.armed:
            recorder.count(obj, len(payload))
        return payload


def _plain_message(obj) -> bytes:
    """``RpcPickler.message`` of a value of a ``c_pickling.PLAIN_VALUES`` type."""
    return _signed(obj, pickle.dumps(obj, cloudpickle.DEFAULT_PROTOCOL))


def _signed(obj, body) -> bytes:
    """``body``, ``obj``'s pickle, as a message: signed if this process signs."""
    payload = body if _wire.key is None else b"".join((_SIGNED, _mac(body), body))
    if recorder.RECORDER.armed:
        recorder.count(obj, len(payload))
    return payload


def _call_message(udf, flat) -> tuple[bytes, list] | None:
    """``RpcPickler.message`` of the usual call and the tensors sent beside it, pickled all
    in C: a carrier of a function found importable, or of a notebook function
    ``c_pickling.reduced_in_c`` reduces, with arguments ``c_pickling.leaves_in_c`` takes;
    None for any other call. The kept pickler asks a Python ``reducer_override`` for each
    of the call's objects, about half of a small call's pickling. ``flat()`` gives the
    kept pickler's table, for tensors and RRefs."""
    carrier = udf.func
    if type(carrier) not in CARRIERS:
        return None
    trace = carrier.trace  # a recorded call's: its id and whether its reply is pickled
    leaves = c_pickling.leaves_in_c((udf.args, udf.kwargs) if trace is None else (udf.args, udf.kwargs, trace))
    if leaves is None:
        return None
    func = carrier.func
    if type(func) is not types.FunctionType:
        return None
    _forget_importable()
    if func not in _importable:  # (an importable one goes by reference, as the kept pickler sends it)
        if not definitions.is_notebook_definition(func):
            return None
        func, made = c_pickling.reduced_in_c(func)
        if func is None:
            _kept.made = made  # each reduced once per message: the kept pickler takes these
            return None
        carrier = carrier.carrying(func)
    call = tuple.__new__(type(udf), (carrier, udf.args, udf.kwargs))
    return _in_c(call, udf, flat() if leaves else None)


def _in_c(obj, counted, flat: dict | None) -> tuple[bytes, list] | None:
    """``obj`` pickled all in C (``c_pickling.pickled_in_c``), signed, counted as ``counted``."""
    pickled = c_pickling.pickled_in_c(obj, flat)
    return None if pickled is None else (_signed(counted, pickled[0]), pickled[1])


def _value_message(obj, flat) -> tuple[bytes, list] | None:
    """``RpcPickler.message`` of a reply (or any message) ``c_pickling.leaves_in_c`` takes,
    pickled all in C, and its tensors; None for any other."""
    leaves = c_pickling.leaves_in_c((obj,))
    if leaves is None:
        return None
    return _in_c(obj, obj, flat() if leaves else None)


class _Kept(threading.local):
    """This thread's pickler, kept from one message to the next, whether it is pickling
    one now (a message pickled inside another gets a pickler of its own), and the notebook
    functions' reductions ``c_pickling.reduced_in_c`` made for this message, by function."""

    def __init__(self):
        self.pickler: RpcPickler | None = None
        self.busy = False
        self.made: dict | None = None


_kept = _Kept()


def serialize(self, obj):
    """torch's ``_InternalRPCPickler.serialize``: ``obj``'s pickle and the tensors it
    sends beside it, pickled with the thread's kept pickler of the class torch is set to
    use (a new pickler per message cost a small call's two messages 6-7 us). The same
    dispatch table as torch's (RRefs, ScriptModules, registered reducers)."""
    cls = torch_compat.pickler_class()
    if not issubclass(cls, RpcPickler):
        return torch_compat.torch_serialize(self, obj)
    if type(obj) in c_pickling.PLAIN_VALUES:
        return _plain_message(obj), []

    def flat() -> dict:  # the kept pickler's table, as it would pickle this message with
        return _flat_for(cls, _prepared(self))

    message = _call_message(obj, flat) if type(obj) is torch_compat.PythonUDF else _value_message(obj, flat)
    if message is not None:
        return message
    _forget_importable()
    table = _prepared(self)
    if isinstance(obj, torch.jit.ScriptModule):
        table[obj.__class__] = self._script_module_reducer
    kept = _kept
    pickler = kept.pickler
    if kept.busy or type(pickler) is not cls:
        pickler = cls(io.BytesIO())
        if not kept.busy:
            kept.pickler = pickler
    nested, kept.busy = kept.busy, True
    tables = torch_compat.tensor_tables
    outer = getattr(tables, "send_tables", None)
    tables.send_tables = []
    try:
        pickler.dispatch_table = table
        return pickler.message(obj), tables.send_tables
    finally:
        kept.busy, kept.made = nested, None
        if outer is None:
            del tables.send_tables
        else:
            tables.send_tables = outer


def _prepared(torch_pickler) -> dict:
    """torch's dispatch table with its RRef and registered reducers in, as torch's
    ``serialize`` puts them in each message's pickler."""
    table = torch_pickler._dispatch_table
    if _wire.prepared != (table, len(torch_pickler._class_reducer_dict)) or rpc.PyRRef not in table:
        table[rpc.PyRRef], table[rpc.RRef] = torch_pickler._py_rref_reducer, torch_pickler._rref_reducer
        table.update(torch_pickler._class_reducer_dict)
        _wire.prepared = (table, len(torch_pickler._class_reducer_dict))
    return table


def _flat_for(cls: type, table: dict) -> dict:
    """The flattened table a pickler of class ``cls`` pickles with over ``table``."""
    pickler = _kept.pickler
    return (pickler if type(pickler) is cls else cls(io.BytesIO()))._flat_table(table)


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
    """Make torch RPC in this process use ``RpcPickler``, kept per thread (``serialize``), and
    ``rpc_unpickler`` (idempotent)."""
    torch_compat.patch(torch_compat.PICKLER, RpcPickler)
    torch_compat.patch(torch_compat.UNPICKLER, rpc_unpickler)
    torch_compat.patch(torch_compat.SERIALIZE, serialize)
