"""The second route of ``serialization``: the usual call, or a reply, pickled all in C by a
plain C pickler, no Python code run per object but the reducers in its table.

- ``call_message``: a call's message, where its carrier's function is importable or a
  notebook function ``reduced_in_c`` reduces, and ``leaves_in_c`` takes its arguments;
  else the reductions made on the way, for the kept pickler (``cloudpickling``).
- ``value_message``: a reply's (or any message's) message, where ``leaves_in_c`` takes it.
- ``leaves_in_c``: whether a message's values can go this way (plain values, tensors and
  RRefs, in small tuples, lists and dicts and in instances of notebook classes the
  receiver holds: ``held_instances``), and what of the table they need (``PLAIN``,
  ``TABLE``, ``SHARED_MEMORY``); ``flat_leaves`` the same in one pass for a call's usual
  arguments and a reply.
- ``reduced_in_c``: a notebook function's reduction made ready for the C pickler.
- ``_in_c``: the message pickled by this thread's C pickler and signed, with the kept
  pickler's table where it holds tensors or RRefs: the same bytes and tensors (shared
  memory's reducer and message scope only where a tensor's storage is big enough for it).
"""

from __future__ import annotations

import io
import pickle
import threading
import types

import cloudpickle
import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from . import cloudpickling, definitions, held_instances, module_globals, shared_tensors, signing
from .plain_values import PLAIN_VALUES
from .receivers import receivers


class Reduced(tuple):
    """A reduction (callable, arguments) in a call's place of the function it rebuilds:
    the C pickler's table gives it back as it is (``tuple``), where the C pickler writes
    any function as a global before it looks in a table."""

    __slots__ = ()


class _CPickler(threading.local):
    """This thread's plain C pickler for ``_in_c``: its table for plain values, and
    for tensors and RRefs a table ``in_c_table`` made of the kept pickler's."""

    def __init__(self):
        self.body = io.BytesIO()
        self.pickler = pickle.Pickler(self.body, cloudpickle.DEFAULT_PROTOCOL)
        self.plain = self.pickler.dispatch_table = {Reduced: tuple}


def in_c_table(flat: dict) -> dict:
    """The C pickler's table over ``flat``, the kept pickler's flattened one: with the
    reductions ``reduced_in_c`` makes (made once per change of ``flat``, by ``serialization``)."""
    return {**flat, Reduced: tuple}


_c_pickler = _CPickler()
_tensor_tables = torch_compat.tensor_tables
# How many values a message's arguments (or its reply) are looked through for the C path
# at most: past it, the kept pickler, which pickles a big container of plain values in C too.
WALK_LIMIT = 64
# What the C path takes besides plain values: the kept pickler's table reduces them.
_TABLE_LEAVES = frozenset({torch.Tensor, rpc.PyRRef, rpc.RRef})
# What a message's values need of the table (``leaves_in_c``): nothing (plain values), torch's
# tensor table (tensors and RRefs), or shared memory's reducer and message scope besides (a
# tensor whose storage may go through a segment: ``shared_tensors.below_shared``).
PLAIN, TABLE, SHARED_MEMORY = 0, 1, 2
_ALL_PLAIN = PLAIN_VALUES.issuperset  # of an iterable of types: whether each is a plain value's


def call_message(udf, flat) -> tuple[tuple[bytes, list] | None, dict | None]:
    """The message of the usual call and the tensors sent beside it, pickled all in C, as
    the kept pickler would pickle them: a carrier of a function found importable, or of a
    notebook function ``reduced_in_c`` reduces, with arguments ``leaves_in_c`` takes;
    else None, and the notebook functions' reductions made on the way (each made once per
    message: the kept pickler takes them), if any. The kept pickler asks a Python
    ``reducer_override`` for each of the call's objects, about half of a small call's
    pickling. ``flat(shared)`` gives the kept pickler's table, for tensors and RRefs (with
    shared memory's reducer, or not where no tensor's storage is big enough for it)."""
    carrier = udf.func
    if type(carrier) not in cloudpickling.CARRIERS:
        return None, None
    trace = carrier.trace  # a recorded call's: its id and whether its reply is pickled
    args, kwargs, instances = udf.args, udf.kwargs, {}
    if trace is None and type(kwargs) is dict and not kwargs and type(args) is tuple:
        leaves = flat_leaves(args, instances)  # the usual call: positional arguments only
    else:
        leaves = leaves_in_c((args, kwargs) if trace is None else (args, kwargs, trace), instances)
    if leaves is None:
        return None, None
    func = carrier.func
    if type(func) is not types.FunctionType:
        return None, None
    cloudpickling.forget_importable()
    if func not in cloudpickling.importable:  # (an importable one goes by reference, as the kept pickler sends it)
        held = receivers.held(func)  # a top-level notebook function its receiver holds, as last sent
        if held is not None:
            func = Reduced(held)
        elif not definitions.is_notebook_definition(func):
            return None, None
        else:
            func, made = reduced_in_c(func)
            if func is None:
                return None, made
        carrier = carrier.carrying(func)
    call = tuple.__new__(type(udf), (carrier, udf.args, udf.kwargs))
    return _in_c(call, udf, flat, leaves, instances), None


def value_message(obj, flat) -> tuple[bytes, list] | None:
    """The message of a reply (or any message) ``leaves_in_c`` takes, pickled all in C,
    and its tensors; None for any other."""
    instances = {}
    leaves = flat_leaves((obj,), instances)
    if leaves is None:
        return None
    return _in_c(obj, obj, flat, leaves, instances)


def fetched_message(obj, flat) -> tuple[bytes, list] | None:
    """The message of an RRef's value that holds instances of top-level notebook classes,
    for a fetch (``to_here``) by any of the RRef's holders, which the owner cannot tell:
    the classes by identity (a fetcher that lacks one stops at it, ``held_instances.NotHeld``,
    and fetches again in full). None where the value holds no such instance, or an RRef (a
    fork made here would wait for a confirmation that a stopped fetch never sends)."""
    instances = {}
    receivers.fetching(True)
    try:
        leaves = flat_leaves((obj,), instances)
    finally:
        receivers.fetching(False)
    if leaves is None or not instances:
        return None
    return _in_c(obj, obj, lambda shared: {**flat(shared), **_NO_RREF}, leaves, instances)


def _no_rref(rref):
    raise pickle.PicklingError("an RRef in a fetched value goes by the kept pickler")


_NO_RREF = dict.fromkeys((rpc.PyRRef, rpc.RRef), _no_rref)


def _in_c(obj, counted, flat, leaves: int, instances: dict) -> tuple[bytes, list] | None:
    """``obj``'s message by this thread's C pickler, signed, counted as ``counted``, and its
    tensors; None where it fails (the kept pickler then says why). Its ``leaves`` say what
    of the table it takes (``flat(shared)``, the kept pickler's made ``in_c_table``): none
    for plain values; torch's tensor table of this message for tensors and RRefs, or shared
    memory's reducer in a message scope besides (``SHARED_MEMORY``), as the kept pickler
    sends them; and the reducers of held notebook classes' ``instances``. One frame: it
    runs for every message of the usual call."""
    c_pickler = _c_pickler
    pickler = c_pickler.pickler
    table = flat(leaves == SHARED_MEMORY) if leaves else c_pickler.plain
    pickler.dispatch_table = {**table, **instances} if instances else table
    tables = outer = None
    sent = []
    try:
        if not leaves:  # plain values (and reductions) only: no tensor table, no shared memory
            pickler.dump(obj)
        else:  # torch's tensor table of this message set (this thread's: getattr would raise where unset)
            tables = _tensor_tables.__dict__
            outer = tables.get("send_tables")
            tables["send_tables"] = sent
            if leaves == SHARED_MEMORY:  # its segments freed again if it fails
                with shared_tensors.PICKLING:
                    pickler.dump(obj)
            else:
                pickler.dump(obj)
        body = c_pickler.body.getvalue()
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    finally:
        pickler.clear_memo()
        c_pickler.body.seek(0)
        c_pickler.body.truncate()
        if tables is not None:
            if outer is None:
                del tables["send_tables"]
            else:
                tables["send_tables"] = outer
    return signing.message(counted, body, sent), sent


def _leaf(value, cls: type, leaves: int) -> int:
    """What a message needs of the table (``PLAIN``, ``TABLE``, ``SHARED_MEMORY``) once
    ``value``, a tensor or an RRef of type ``cls``, is in it beside ``leaves``."""
    if leaves == SHARED_MEMORY or cls is not torch.Tensor or not shared_tensors.SHARED.enabled:
        return TABLE if leaves == PLAIN else leaves
    return TABLE if shared_tensors.below_shared(value) else SHARED_MEMORY


def leaves_in_c(values, instances: dict, leaves: int = PLAIN, left: int = WALK_LIMIT) -> int | None:
    """What ``values`` need of the table (``PLAIN``, ``TABLE``, ``SHARED_MEMORY``), where
    the C pickler with the kept pickler's table makes of them what the kept pickler does:
    plain values, tensors and RRefs (not a module's global, which ``reducer_override`` sends
    by name; torch's patch points hold functions and classes only), in tuples, lists, dicts
    and instances of notebook classes the receiver holds (their classes' reducers noted in
    ``instances``: ``held_instances``), ``left`` values at most (``WALK_LIMIT``, less those
    ``flat_leaves`` looked at, which need ``leaves`` so far); else None. A container of
    plain values alone is told so in C, each of its values counted."""
    todo = list(values)
    while todo:
        value = todo.pop()
        cls = type(value)
        left -= 1
        if left < 0:
            return None
        if cls in PLAIN_VALUES:
            continue
        if cls is tuple or cls is list:
            if _ALL_PLAIN(map(type, value)):
                left -= len(value)
            else:
                todo += value
        elif cls is dict:
            if _ALL_PLAIN(map(type, value)) and _ALL_PLAIN(map(type, value.values())):
                left -= 2 * len(value)
            else:
                todo += value.keys()
                todo += value.values()
        elif cls in _TABLE_LEAVES and module_globals.find(value) is None:
            leaves = _leaf(value, cls, leaves)
        else:
            fields = _held_instance(value, cls, instances)
            if fields is None:
                return None
            if fields:
                todo.append(fields)  # (walked as a dict)
    return None if left < 0 else leaves


def _held_instance(value, cls: type, instances: dict) -> dict | None:
    """The fields of ``value`` to walk (none where they are all plain values), if it is an
    instance ``held_instances`` takes, its class's reducer noted in ``instances``; else None."""
    found = held_instances.held(value, cls)
    if found is None:
        return None
    fields, instances[cls] = found
    if _ALL_PLAIN(map(type, fields.values())) and _ALL_PLAIN(map(type, fields)):
        return {}
    return fields


def flat_leaves(values: tuple, instances: dict) -> int | None:
    """``leaves_in_c(values, instances)`` (a call's positional arguments, its keywords empty,
    or a reply alone), told in one pass where each of ``values`` is a plain value, a tensor,
    an RRef or a held instance of plain fields; from the first container (or instance of
    other fields) on, ``leaves_in_c`` walks the rest."""
    if len(values) > WALK_LIMIT - 2:
        return leaves_in_c(values, instances)
    leaves = PLAIN
    for i, value in enumerate(values):
        cls = type(value)
        if cls in PLAIN_VALUES:
            continue
        if cls in _TABLE_LEAVES and module_globals.find(value) is None:
            leaves = _leaf(value, cls, leaves)
        elif cls is tuple or cls is list or cls is dict:
            return leaves_in_c(values[i:], instances, leaves, WALK_LIMIT - i)
        else:
            fields = _held_instance(value, cls, instances)
            if fields is None:
                return None
            if fields:
                return leaves_in_c(values[i:], instances, leaves, WALK_LIMIT - i)
    return leaves


def reduced_in_c(func: types.FunctionType) -> tuple[Reduced | None, dict | None]:
    """A notebook function's reduction as the C pickler writes it: one call of plain values,
    or a function its receiver holds with the notebook functions it uses, each such a call;
    for any other, None and the reductions made here, by function, for the kept pickler."""
    reduction = definitions.reduce_function(func)
    if len(reduction) == 2:
        return Reduced(reduction), None
    made = {func: reduction}
    uses = definitions.held_uses(reduction)
    for used in uses or ():
        if type(used) is types.FunctionType and used not in made:  # (a recursive one uses itself)
            made[used] = definitions.reduce_function(used)
    if uses is None or any(len(made.get(used, ())) != 2 for used in uses):
        return None, made
    return Reduced((*reduction[:2], tuple(Reduced(made[used]) for used in uses), *reduction[3:])), None
