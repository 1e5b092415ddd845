"""How a member pickles what it sends over torch RPC: torch's ``serialize``, replaced.

Each message takes the first of three routes that takes it, the same bytes whichever:

1. A plain value (None, a bool, a number, a string, bytes: a small call's usual reply):
   ``plain_values``, plain ``pickle`` in C, no table.
2. The usual call (a carrier of an importable or notebook function, its arguments plain
   values, tensors and RRefs in small containers), or a reply of such values:
   ``c_pickling``, a plain C pickler with the kept pickler's table.
3. Anything else (notebook classes and closures by value, a function the C pickler
   cannot take, big or odd containers, a ScriptModule): ``cloudpickling``, the kept
   pickler, a cloudpickle pickler kept per thread; it takes the notebook functions'
   reductions the second route made on its way (``c_pickling.call_message``).

A reply goes to its caller: a top-level notebook class the caller made goes by identity
(``receivers.replying``, told by the served call). An RRef's value goes to a fetcher this
process cannot tell: its held instances' classes by identity, a fetcher lacking one
fetching again in full (``c_pickling.fetched_message``). Every message is signed, and
``rpc_unpickler`` checks the signature before it unpickles anything (``signing``).
"""

from __future__ import annotations

import copyreg
import io
import pickle

import torch

from .._compat import rpc_pickler, torch_compat
from ..recording import recorder, rref_ledger
from . import c_pickling, cloudpickling, plain_values, remote_errors, shared_tensors, signing, tensor_table
from .cloudpickling import RpcPickler
from .receivers import receivers
from .signing import set_key  # noqa: F401 (the members' settings set the key here)


class _TorchTable:
    """(torch's table, how many reducers were registered) when torch's RRef and registered
    reducers were last put in it (``_prepared``); and the kept pickler's flattened table,
    with shared memory's reducer and without, and what they were made from (``flat``: the
    key ``serialize`` makes)."""

    def __init__(self):
        self.prepared: tuple | None = None
        self.flat: tuple | None = None


_torch_table = _TorchTable()


def serialize(self, obj):
    """torch's ``_InternalRPCPickler.serialize``: ``obj``'s pickle and the tensors it
    sends beside it, by the first route that takes it (see the module's docstring), with
    the same dispatch table as torch's (RRefs, ScriptModules, registered reducers)."""
    cls = torch_compat.pickler_class()
    if not issubclass(cls, RpcPickler):
        return torch_compat.torch_serialize(self, obj)
    if type(obj) in plain_values.PLAIN_VALUES:
        return plain_values.message(obj), []
    if type(obj) is torch_compat.RemoteException:  # a failed call's reply
        obj = remote_errors.recreating(obj)

    def flat(shared: bool) -> dict:  # the kept pickler's table, as it would pickle this message with
        # What it is made from (``RpcPickler._flat_table``): torch's table and reducers, the
        # copyreg table, the ledger's and shared memory's switches; asked by each message
        # with tensors or RRefs, made once per change.
        key = (cls, *rpc_pickler.table_state(self), len(copyreg.dispatch_table), rref_ledger.is_tracking(),
               shared_tensors.SHARED.enabled)
        made = _torch_table.flat
        if made is None or made[0] != key:
            made = _torch_table.flat = (key, *_flat_tables(cls, _prepared(self)))
        return made[1] if shared else made[2]

    if type(obj) is torch_compat.PythonUDF:
        message, made = c_pickling.call_message(obj, flat)
        return message or _kept_message(self, cls, obj, made)
    # A reply: to its caller's process, if a served call named it (``receivers.replying``);
    # a class its caller made goes there by identity (``definitions.reduce_class``).
    if receivers.reply_home(obj) is None:
        if type(obj).__module__ == "__main__" and receivers.is_owned(obj):  # an RRef's value, a fetch's reply
            message = c_pickling.fetched_message(obj, flat)  # its held classes by identity, where it can
            if message is not None:
                return message
        return c_pickling.value_message(obj, flat) or _kept_message(self, cls, obj, None)
    try:
        return c_pickling.value_message(obj, flat) or _kept_message(self, cls, obj, None)
    finally:
        receivers.going_home(None)


def _kept_message(torch_pickler, cls: type, obj, made: dict | None) -> tuple[bytes, list]:
    """``obj``'s message by the kept pickler (the third route), ``made`` the notebook
    functions' reductions the second made on its way."""
    cloudpickling.forget_importable()
    table = _prepared(torch_pickler)
    if isinstance(obj, torch.jit.ScriptModule):
        table[obj.__class__] = rpc_pickler.script_module_reducer(torch_pickler)
    return cloudpickling.message(obj, cls, table, made)


def _flat_tables(cls: type, table: dict) -> tuple[dict, dict]:
    """The C pickler's table over the kept pickler's flattened one (``c_pickling.in_c_table``),
    and the same without shared memory's reducer, for a message none of whose tensors is
    big enough for it."""
    flat = c_pickling.in_c_table(cloudpickling.flat_table(cls, table))
    if not shared_tensors.is_enabled() or torch.Tensor not in table:
        return flat, flat
    return flat, {**flat, torch.Tensor: tensor_table.reducer(table[torch.Tensor])}


def _prepared(torch_pickler) -> dict:
    """torch's dispatch table with its RRef and registered reducers in (``rpc_pickler``)."""
    table, _torch_table.prepared = rpc_pickler.prepared_table(torch_pickler, _torch_table.prepared)
    return table


def rpc_unpickler(file: io.BytesIO, **kwargs) -> pickle.Unpickler:
    """torch's unpickler for ``file``, once its signature is checked (``signing.check``):
    a function rather than a subclass, so that loading stays all in C."""
    signing.check(file)
    if recorder.RECORDER.fetches:  # a recorded to_here's reply
        recorder.received(len(file.getbuffer()))
    return pickle.Unpickler(file, **kwargs)


# The globals that the usual messages name (nbrpc's: a call's carrier, a function and a
# class by identity, a tensor or an RRef in torch's table; torch's private ones of RPC:
# a call, an RRef helper): pickle writes each as a code (``copyreg.add_extension``) that
# the receiver finds in a table of its unpickler, where a name costs it an import and a
# lookup (a few microseconds a message on a busy machine). Every member registers the
# same codes (above 255, which pickle's own registry leaves free).
EXTENSIONS = {("nbrpc.calls.interrupts", "Stoppable"): 0x6E62,
              ("nbrpc.calls.interrupts", "Awaited"): 0x6E63,
              ("nbrpc.wire.definitions", "_pinned_function"): 0x6E64,
              ("nbrpc.wire.held_instances", "instance_of"): 0x6E65,
              ("nbrpc.wire.tensor_table", "receive"): 0x6E66,
              ("nbrpc.recording.rref_ledger", "_receive"): 0x6E67,
              **{(name.__module__, name.__qualname__): 0x6E70 + i
                 for i, name in enumerate(torch_compat.MESSAGE_GLOBALS)}}


def _register_extensions() -> None:
    for (module, name), code in EXTENSIONS.items():
        try:
            copyreg.add_extension(module, name, code)  # (the same again: a no-op)
        except ValueError as e:
            raise RuntimeError(
                f"nbrpc names {module}.{name} by pickle's extension code {code:#x}, and another library "
                f"in this process registered that code or name otherwise ({e}). Remove that registration "
                "(copyreg.remove_extension) before nbrpc starts") from e


def install() -> None:
    """Make torch RPC in this process use ``RpcPickler``, kept per thread (``serialize``), and
    ``rpc_unpickler``, with nbrpc's ``EXTENSIONS`` (idempotent)."""
    _register_extensions()
    torch_compat.patch(torch_compat.PICKLER, RpcPickler)
    torch_compat.patch(torch_compat.UNPICKLER, rpc_unpickler)
    torch_compat.patch(torch_compat.SERIALIZE, serialize)
