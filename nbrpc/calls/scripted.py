"""A TorchScript function compiled again (its cell run a second time), called over RPC.

torch sends a ``ScriptFunction`` by its qualified name, and the callee runs the function
of that name in its own compilation unit. A name compiled once (``__torch__.f``) goes as
torch sends it: the callee runs its own, as each process of a script runs the one its
import compiled. A function compiled again in the same process gets a mangled name
(``__torch__.___torch_mangle_N.f``, N counting every mangle in that process), which a
script never makes and a member holds only by chance (then maybe for another version).

So a call of a mangled one goes under a name made from its source's digest
(``__torch__.nbrpc_<digest>.f``, ``as_sent``): compiled once here, from the same source,
the stand-in that torch's own path sends (its ``@async_execution`` wrapper and profiling
key included), and once on each callee before the first call there (``define``), the
names it uses resolved in the callee's own namespace, as a script's import resolves
them. The newest definition is the one that runs, in every member, as with a Python
function from a cell; a member need not have run the cell again.
"""

from __future__ import annotations

import hashlib
import os
import threading

import torch
import torch.distributed.rpc as rpc

from .._compat import script_functions, torch_compat
from .._compat.script_functions import MANGLE_MARK, Source
from .._compat.torch_compat import UNSET_RPC_TIMEOUT, RPCExecMode

DIGEST_SIZE = 8


class Scripted:
    """This process's stand-ins for TorchScript functions compiled again, and the members
    each stand-in was compiled on (by worker id: a new cluster's workers get new ids).
    One per process; a forked child starts afresh (``reset``)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        # a mangled qualified name (and whether it goes @async_execution) -> (stand-in, its name, source)
        self.stand_ins: dict[tuple[str, bool], tuple] = {}
        self.sources: dict[str, Source] = {}  # a stand-in's name -> what it was compiled from
        self.defined: set[tuple[int, str]] = set()  # (worker id, a stand-in's name) compiled there
        self.renamed: dict[str, int] = {}  # a source's digest -> how many of its names failed to compile


SCRIPTED = Scripted()
os.register_at_fork(after_in_child=SCRIPTED.reset)
_DEFINING = threading.Lock()  # a member compiles each stand-in once, whoever asks


def as_sent(to, func, timeout: float = UNSET_RPC_TIMEOUT):
    """``func``, or, for a TorchScript function this process compiled again (also under
    ``@async_execution``), its stand-in, compiled on ``to`` first if it was not yet."""
    script, is_async = _script_of(func)
    if script is None or MANGLE_MARK not in script.qualified_name:
        return func
    found = _stand_in(script, is_async)
    if found is None:  # no source to compile it from: as torch sends it
        return func
    stand_in, name, source = found
    _define_on(to, name, source, timeout)
    return stand_in


def _script_of(func) -> tuple[torch.jit.ScriptFunction | None, bool]:
    if isinstance(func, torch.jit.ScriptFunction):
        return func, False
    wrapped = getattr(func, torch_compat.ASYNC_EXECUTION_MARK, None)
    if isinstance(wrapped, torch.jit.ScriptFunction):
        return wrapped, True
    return None, False


def _stand_in(script: torch.jit.ScriptFunction, is_async: bool) -> tuple | None:
    key = (script.qualified_name, is_async)
    found = SCRIPTED.stand_ins.get(key)
    if found is not None:
        return found
    source = script_functions.source_of(script, _uses(script_functions.python_function(script)))
    if source is None:
        return None
    digest = _digest(source)
    name = f"__torch__.nbrpc_{digest}_{SCRIPTED.renamed.get(digest, 0)}.{source.name}"
    with SCRIPTED.lock:
        compiled = _compiled(name, source)
        stand_in = rpc.functions.async_execution(compiled) if is_async else compiled
        found = SCRIPTED.stand_ins[key] = (stand_in, name, source)
        SCRIPTED.sources[name] = source
    return found


def _forget(name: str) -> None:
    """A stand-in that failed to compile on a member: torch keeps the name there, taken by
    the broken function, so the next call takes a new name (the same source compiled again),
    and so do the stand-ins that call it."""
    with SCRIPTED.lock:
        digest = _digest(SCRIPTED.sources[name])
        SCRIPTED.renamed[digest] = SCRIPTED.renamed.get(digest, 0) + 1
        dropped, before = {name}, 0
        while len(dropped) != before:
            before = len(dropped)
            for key, (_, made, source) in list(SCRIPTED.stand_ins.items()):
                if made in dropped or any(used in dropped for _, used in source.uses):
                    dropped.add(made)
                    del SCRIPTED.stand_ins[key]


def _uses(func) -> tuple:
    """(global name, stand-in's name) of each TorchScript function compiled again that
    ``func`` calls: on a callee, the stand-in is what that name means in it."""
    if func is None:
        return ()
    uses = []
    for name in func.__code__.co_names:
        script, _ = _script_of(func.__globals__.get(name))
        if script is not None and MANGLE_MARK in script.qualified_name:
            found = _stand_in(script, False)
            if found is not None:
                uses.append((name, found[1]))
    return tuple(uses)


def _digest(source: Source) -> str:
    text = repr((source.module, source.source, sorted(source.defaults.items()), source.uses))
    return hashlib.blake2b(text.encode(), digest_size=DIGEST_SIZE).hexdigest()


def _compiled(name: str, source: Source) -> torch.jit.ScriptFunction:
    """The function of that name here, compiled from ``source`` unless held already."""
    with _DEFINING:
        found = script_functions.find(name)
        return found if found is not None else script_functions.compile_as(name, source)


def _define_on(to, name: str, source: Source, timeout: float) -> None:
    try:
        info = torch_compat.to_worker_info(to)
    except RuntimeError:  # an unknown destination: the call itself says so
        return
    key = (info.id, name)
    if key in SCRIPTED.defined:
        return
    for _, used in source.uses:  # first the stand-ins it calls
        _define_on(to, used, SCRIPTED.sources[used], timeout)
    if info.id != torch_compat.current_agent().get_worker_info().id:
        try:
            torch_compat.invoke_rpc(info, define, RPCExecMode.SYNC, (name, source), None, timeout).wait()
        except RuntimeError as e:
            _forget(name)
            raise RuntimeError(
                f"the TorchScript function {source.name!r}, compiled again here (its cell run again), could "
                f"not be compiled on {info.name!r} from its source, with the names it uses resolved there: "
                f"run the cells it needs there too (%%rpc_on {info.name}), or give it a new name. "
                f"Torch said: {str(e).strip()}") from e
    SCRIPTED.defined.add(key)


def define(name: str, source: Source) -> None:
    """Run on a callee: compile ``source`` under ``name`` unless this process holds it."""
    torch_compat.keep_thread_state()
    _compiled(name, source)
