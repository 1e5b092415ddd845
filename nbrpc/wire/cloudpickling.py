"""The third route of ``serialization``: the kept pickler, a cloudpickle pickler that sends
notebook definitions by value, and anything the other two routes do not take.

torch pickles RPC calls and results with ``pickle.Pickler`` (``torch_compat.torch_pickler``),
which stores functions and classes by reference: a worker has no notebook ``__main__``,
so it fails with "Can't get attribute ... on <module '__main__'>", and lambdas fail
outright. ``RpcPickler`` is a cloudpickle pickler (everything importable stays by
reference) that keeps torch's dispatch table, so tensors still go to torch's tensor
table and RRefs fork; definitions from ``__main__`` travel as ``definitions`` describes,
so they land in each process as a script's would. torch makes a pickler for every
message; each thread here keeps one (``message``), which pickles the same bytes.

- ``RpcPickler``: the pickler; ``message(obj, cls, table, made)``, a message pickled by
  this thread's kept one.
- ``CARRIERS`` (``add_carrier``): what carries a call, pickled as it is.
- ``importable``: functions and classes found to pickle by reference.
- ``explain``: why a value does not pickle, and what to do instead.
"""

from __future__ import annotations

import collections
import copyreg
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
from . import definitions, module_globals, per_process, shared_tensors, signing, tensor_table

_C_DISPATCH_TABLE = pickle.Pickler.__dict__["dispatch_table"]
_C_DUMP = pickle.Pickler.dump
# cloudpickle rebuilds bound methods from their function, by value when the
# function's qualname does not resolve (classmethods such as torch's tensor
# receiver); pickle's own reduction, getattr(owner, name), keeps them by reference.
_BY_REFERENCE = {types.MethodType: types.MethodType.__reduce__}
# Functions and classes found to pickle by reference (importable by name: their modules
# keep them alive anyway).
importable: set = set()
# The types of what carries a Python function to its callee, added by the calls layer
# (``add_carrier``): tuples with the fields ``func``, ``call_id`` and ``trace``
# (``calls.interrupts.Carrier``), and ``carrying(func)``, the same call with another function.
CARRIERS: set = set()
# What ``reducer_override`` leaves as it is: torch's PythonUDF and the carriers.
_AS_THEY_ARE: set = {torch_compat.PythonUDF}


def add_carrier(cls: type) -> None:
    """Instances of ``cls`` carry calls (see ``CARRIERS``): never a module's global, never by value."""
    CARRIERS.add(cls)
    _AS_THEY_ARE.add(cls)


class _Tables:
    """What pickling keeps from one message to the next: the last flattened dispatch
    table, and how many objects stood at torch's patch points when ``importable`` was
    last checked."""

    def __init__(self):
        self.flat: tuple | None = None  # (what it was built from, the table)
        self.points = 0


_tables = _Tables()


def forget_importable() -> None:
    """Forget what was found importable once more objects stand at torch's patch points
    (``torch_compat.patch``): a function pickled by reference before nbrpc put it at one
    goes by that point's name from then on."""
    points = torch_compat.stand_in_count()
    if points != _tables.points:
        importable.clear()
        _tables.points = points


class RpcPickler(cloudpickle.Pickler):
    """cloudpickle with torch's reducers for tensors and RRefs in front; signs what it writes."""

    _shares_tensors = True  # big tensors to local members through shared memory

    def __init__(self, file, protocol=None, buffer_callback=None):
        self._out, self._body = file, io.BytesIO()
        self.made: dict | None = None  # the message's notebook functions reduced already, by function
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
        key = (type(self), table, len(table), table.get(torch.Tensor), rref_ledger.is_tracking(),
               len(copyreg.dispatch_table), shared)  # (a reducer registered for tensors replaces torch's)
        if _tables.flat is None or _tables.flat[0] != key:
            # Tensors in torch's table under ``tensor_table``'s receiver; big ones between
            # local members through shared memory.
            tensors = {torch.Tensor: tensor_table.reducer(table[torch.Tensor])} if torch.Tensor in table else {}
            if shared:
                tensors[torch.Tensor] = shared_tensors.reducer(tensors[torch.Tensor])
            maps = (tensors, self._rref_reducers(), table, _BY_REFERENCE, cloudpickle.Pickler.dispatch_table)
            _tables.flat = (key, dict(collections.ChainMap(*maps)))
        return _tables.flat[1]

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
        # and an object found importable is no stand-in (see ``forget_importable``).
        cls = type(obj)
        if cls in _AS_THEY_ARE:
            return NotImplemented
        is_function = cls is types.FunctionType
        is_class = not is_function and isinstance(obj, type)
        if (is_function or is_class) and obj in importable:
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
            made = self.made  # made already for this message (``c_pickling.reduced_in_c``)
            reduction = made and made.pop(obj, None)
            return reduction or definitions.reduce_function(obj)
        reduced = super().reducer_override(obj)
        if reduced is NotImplemented:  # pickled by reference
            importable.add(obj)
        elif is_function:
            # by value, unless a module's object keeps it (sys.stdout.write while a
            # kernel's cell runs): then the receiver's (see module_globals)
            held = module_globals.find_attribute(obj)
            if held is not None:
                return getattr, held
        return reduced

    def dump(self, obj):
        self._out.write(self.message(obj))

    def message(self, obj, made: dict | None = None) -> bytes:
        """``obj`` pickled and signed (``made``: notebook functions reduced already, by
        function). The pickler then forgets it (its memo holds what it pickled, and a
        value must not outlive its message here) and can pickle the next."""
        body = self._body
        self.made = made
        try:
            with shared_tensors.PICKLING:
                _C_DUMP(self, obj)  # cloudpickle's dump adds only a word on deep recursion
            with body.getbuffer() as view:
                payload = signing.signed(view)
        except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as e:
            raise SerializationError(explain(obj, e)) from e
        finally:
            self.made = None
            self.clear_memo()
            self.globals_ref = {}  # cloudpickle's, per pickle
            body.seek(0)
            body.truncate()
        if recorder.RECORDER.armed:
            recorder.count(obj, len(payload))
        return payload


class _KeptPickler(threading.local):
    """This thread's kept pickler, from one message to the next, and whether it is
    pickling one now (a message pickled inside another gets a pickler of its own)."""

    def __init__(self):
        self.pickler: RpcPickler | None = None
        self.busy = False


_kept_pickler = _KeptPickler()


def kept() -> RpcPickler | None:
    """This thread's kept pickler, if it made one."""
    return _kept_pickler.pickler


def message(obj, cls: type, table: dict, made: dict | None) -> tuple[bytes, list]:
    """``obj``'s message and the tensors sent beside it, pickled by this thread's kept
    pickler of class ``cls`` with ``table`` (torch's dispatch table), ``made`` its
    notebook functions reduced already (a new pickler per message cost a small call's
    two messages 6-7 us)."""
    this = _kept_pickler
    pickler = this.pickler
    if this.busy or type(pickler) is not cls:
        pickler = cls(io.BytesIO())
        if not this.busy:
            this.pickler = pickler
    nested, this.busy = this.busy, True
    tables = torch_compat.tensor_tables
    outer = getattr(tables, "send_tables", None)
    tables.send_tables = []
    try:
        pickler.dispatch_table = table
        return pickler.message(obj, made), tables.send_tables
    finally:
        this.busy = nested
        if outer is None:
            del tables.send_tables
        else:
            tables.send_tables = outer


def flat_table(cls: type, table: dict) -> dict:
    """The flattened table a pickler of class ``cls`` pickles with over ``table``."""
    pickler = _kept_pickler.pickler
    return (pickler if type(pickler) is cls else cls(io.BytesIO()))._flat_table(table)


def explain(obj, error: Exception) -> str:
    """Name the argument or value that failed to pickle, and what to do instead."""
    if isinstance(obj, torch_compat.PythonUDF):
        func_name = getattr(obj.func, "__qualname__", type(obj.func).__name__)
        named = [(f"the function {func_name}", obj.func)]
        named += [(f"argument {i}", v) for i, v in enumerate(obj.args or ())]
        named += [(f"keyword argument {k!r}", v) for k, v in (obj.kwargs or {}).items()]
    else:
        named = [("the result", obj)]
    for _, value in named:
        culprit = _unsendable_global(value, _pickles)
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


def _unsendable_global(obj, pickles, seen: set | None = None) -> str | None:
    """Name the global a notebook definition uses that cannot be sent, if that is why
    ``obj`` failed to pickle: "the global 'lock' (lock) that locked_get uses"."""
    seen = set() if seen is None else seen
    if id(obj) in seen or not definitions.is_notebook_definition(obj):
        return None
    seen.add(id(obj))
    if isinstance(obj, type):
        members = [v for v in vars(obj).values() if isinstance(v, types.FunctionType)]
        return next(filter(None, (_unsendable_global(m, pickles, seen) for m in members)), None)
    for name, value in definitions.fill_ins(obj).items():
        if definitions.is_notebook_definition(value):
            found = _unsendable_global(value, pickles, seen)
            if found:
                return found
        elif not pickles(per_process.fresh(value)):
            return f"the global {name!r} ({type(value).__name__}) that {obj.__qualname__} uses"
    return None


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
