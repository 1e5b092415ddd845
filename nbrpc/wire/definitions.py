"""Notebook definitions over RPC: one persistent namespace per process, as in a script.

A script run under torch RPC is imported in every process: each process has the same
functions and classes, bound to its own module globals. Notebook definitions (from
``__main__``: a notebook's cells, ``%%rpc_on`` cells on a worker) exist in one process
only, so they travel by value; this module makes them land the way the script's would.

The parts:

- **Identity.** Each definition a process sends gets an origin (this process, one id
  per process incarnation) and a token; a definition received keeps the identity it
  came with, so a worker forwarding the driver's function forwards the driver's id.
- **Sending** (``reduce_function``, ``reduce_class``): the function's code is pickled
  once and cached with its digest; defaults, closure, and the current values of the
  globals it uses ("fill-ins") travel with every call, as cloudpickle's would.
- **By digest, by identity** (``receivers``): once the call's destination answered a
  call that carried a code in full, later calls send its digest; a top-level function
  it holds goes by identity, with the notebook definitions it uses (``_by_identity``),
  and so does a top-level class it holds (``reduce_class``).
  A changed code goes in full again; so do calls before the first answer, and replies
  but for a top-level class going home to the caller that made it (it pins what it sends).
- **Receiving** (``_function_shell``/``_bind_function``, ``_class_shell``/``_bind_class``):
  a definition coming home is the process's own object. Otherwise it is built once per
  origin, token and version, with the process's namespace (``__main__``) as its globals;
  fill-ins fill only names the namespace lacks, so module-level state persists per
  process; a definition is stored under its name unless that name holds something
  else than an earlier version of the same definition from the same origin.
- **Per-process primitives** (``per_process``): a lock, condition, event or semaphore
  used as a global arrives as a fresh one, as an import would make it.
"""

from __future__ import annotations

import enum
import hashlib
import linecache
import os
import pickle
import sys
import threading
import types
import uuid
import weakref
from dataclasses import dataclass

import cloudpickle

from .._compat import cloudpickle_compat as cp
from . import per_process
from .receivers import receivers

DIGEST_SIZE = 16


@dataclass
class Identity:
    """Where a definition was made, and (functions) the code that was last pickled."""

    origin: str
    token: int
    version: int = 0
    code: types.CodeType | None = None
    payload: bytes = b""
    digest: bytes = b""
    global_names: tuple = ()


class Registry:
    """This process's notebook definitions: what it made and sent (by token), what it
    received (by origin and token), the shells still to build, the pickled code, the code
    received by digest and the top-level functions kept for senders that name them by
    identity. One per process; a forked child starts afresh (``reset``)."""

    def __init__(self):
        self.reset()
        self.code_payloads: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # code -> (pickle, digest)
        self.next_token = 0

    def reset(self) -> None:
        """A new process: new origin, nothing sent or received yet."""
        self.lock = threading.RLock()
        self.origin = uuid.uuid4().hex
        self.identities: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # definition -> Identity
        self.own: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # token -> this process's definition
        self.received: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # (origin, token) -> definition
        self.unbuilt: weakref.WeakSet = weakref.WeakSet()  # shells whose state has not been applied yet
        self.names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # shell -> global name to store it under
        self.codes: dict[bytes, types.CodeType] = {}  # digest -> code received in full (never dropped: small)
        # (origin, token, version) -> a top-level function or class (version 0) received
        # (or come home) in full: kept, so that a sender may name it by identity; one per
        # definition sent here.
        self.pinned: dict[tuple, types.FunctionType | type] = {}
        receivers.reset()


REGISTRY = Registry()
os.register_at_fork(after_in_child=REGISTRY.reset)


def namespace() -> dict:
    """This process's namespace for notebook definitions: ``__main__`` (a kernel's user
    namespace, so ``%%rpc_on`` cells and RPC calls share it)."""
    return sys.modules["__main__"].__dict__


def is_notebook_definition(obj) -> bool:
    """Functions and classes of ``__main__`` travel by value and are bound on arrival."""
    if getattr(obj, "__module__", None) != "__main__":
        return False
    return isinstance(obj, types.FunctionType) or (
        isinstance(obj, type) and not issubclass(obj, enum.Enum))


def _identity(obj) -> Identity:
    found = REGISTRY.identities.get(obj)  # made once: the lock only to make it
    if found is not None:
        return found
    with REGISTRY.lock:
        found = REGISTRY.identities.get(obj)
        if found is None:
            REGISTRY.next_token += 1
            found = REGISTRY.identities[obj] = Identity(REGISTRY.origin, REGISTRY.next_token)
            REGISTRY.own[found.token] = obj
        return found


# -- sending -----------------------------------------------------------------------


def reduce_function(func: types.FunctionType) -> tuple:
    """Pickle a notebook function: its cached code, then its state for this call.

    A plain function (no globals, closure, defaults, attributes or annotations: a
    cell's ``def f(x): return x * 2``) has no state, and goes as one call that builds
    and binds it: the least to pickle and unpickle."""
    ident = _identity(func)
    if ident.code is not func.__code__:
        _cache_code(ident, func)
    name = _stored_under(func)
    if name is not None:  # top-level: a receiver that has it keeps it (``REGISTRY.pinned``)
        key = (ident.origin, ident.token, ident.version)
        if receivers.holds(key):
            if not ident.global_names:  # the identity alone, until the name or code changes
                receivers.remember(func, name, key, (_pinned_function, (key,)))
            return _by_identity(func, key, ident)
    head = (ident.origin, ident.token, ident.version, name)
    names = (func.__name__, func.__qualname__, func.__doc__)
    by_digest = receivers.holds(ident.digest)
    if (not ident.global_names and func.__closure__ is None and func.__defaults__ is None
            and func.__kwdefaults__ is None and not func.__dict__ and not func.__annotations__):
        if by_digest:
            return _plain_function_by_digest, (*head, ident.digest, *names)
        return _plain_function, (*head, ident.payload, *names, ident.digest)
    fills = {name: per_process.fresh(value) for name, value in _fills(func, ident.global_names).items()}
    closure = None if func.__closure__ is None else [cp.cell_contents(c) for c in func.__closure__]
    state = (func.__defaults__, func.__kwdefaults__, closure, dict(func.__dict__),
             func.__annotations__, fills)
    if by_digest:
        return (_function_shell_by_digest, (*head, ident.digest, *names), state, None, None, _bind_function)
    return (_function_shell, (*head, ident.payload, *names, ident.digest), state, None, None, _bind_function)


def _by_identity(func: types.FunctionType, key: tuple, ident: Identity) -> tuple:
    """A top-level function the receiver holds: its identity, and the notebook definitions
    it uses (a newer one, from a cell run again, is stored under its name there)."""
    uses = ident.global_names and tuple(
        v for v in _fills(func, ident.global_names).values() if is_notebook_definition(v))
    if not uses:  # the identity alone: nothing to set on arrival
        return _pinned_function, (key,)
    return (_pinned_function, (key,), uses, None, None, _touch)


def held_uses(reduction: tuple) -> tuple | None:
    """The notebook definitions in a held function's reduction (``_by_identity``), or None
    for any other reduction."""
    return reduction[2] if reduction[0] is _pinned_function else None


def _cache_code(ident: Identity, func: types.FunctionType) -> None:
    with REGISTRY.lock:
        code = func.__code__
        cached = REGISTRY.code_payloads.get(code)
        if cached is None:  # shared by every function made from this code (lambdas in a loop)
            # cloudpickle sends "<dynamic-code>" as the file name: the cell's own name
            # goes with it, so stacks and diagnoses on the receiver can name the cell,
            # and its lines, so tracebacks there show them.
            payload = cloudpickle.dumps((code, code.co_filename, _source_of(code)))
            digest = hashlib.blake2b(payload, digest_size=DIGEST_SIZE).digest()
            cached = REGISTRY.code_payloads[code] = (payload, digest)
        ident.payload, ident.digest = cached
        ident.global_names = tuple(cp.code_globals(code))
        ident.code = code
        ident.version += 1


SOURCE_LINES_SENT = 2000  # a longer file (a script run as __main__) goes without its source


def _source_of(code: types.CodeType) -> list[str] | None:
    """The lines of the cell (or file) ``code`` was written in: the receiver shows them
    in the tracebacks of errors the function raises there."""
    lines = linecache.getlines(code.co_filename)
    return lines if lines and len(lines) <= SOURCE_LINES_SENT else None


def _keep_lines(filename: str, lines: list[str] | None) -> None:
    """Put a received definition's lines in ``linecache`` under its file name (no mtime:
    ``checkcache`` keeps them), unless this process has that file itself."""
    if lines and not os.path.exists(filename):
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def fill_ins(func: types.FunctionType) -> dict:
    """The globals ``func`` uses, with their values here."""
    return _fills(func, cp.code_globals(func.__code__))


def _fills(func: types.FunctionType, names) -> dict:
    scope = func.__globals__
    return {name: scope[name] for name in names if name in scope}


def reduce_class(cls: type) -> tuple:
    """Pickle a notebook class: identity and skeleton first, then its attributes; a top-level
    one its receiver holds or made (a reply going home), by identity (class-level state stays)."""
    ident = _identity(cls)
    stored = _stored_under(cls)
    if stored is not None:
        key = (ident.origin, ident.token, 0)
        if receivers.holds(key) or receivers.made_by_receiver(ident.origin):
            return _pinned_function, (key, "class")
        if ident.origin == REGISTRY.origin:  # its receivers may send it back by identity
            REGISTRY.pinned[key] = cls
    _, name, bases, type_kwargs, _, _ = cp.class_skeleton(cls)
    if "__slots__" in vars(cls):  # real slots there too (cloudpickle's skeleton has none): as here
        type_kwargs = {**type_kwargs, "__slots__": vars(cls)["__slots__"]}
    args = (ident.origin, ident.token, stored, type(cls), name, bases, type_kwargs)
    return (_class_shell, args, cp.class_state(cls), None, None, _bind_class)


def class_identity(cls: type) -> tuple:
    """A notebook class's reduction by identity (``reduce_class``'s, where it holds)."""
    ident = _identity(cls)
    return _pinned_function, ((ident.origin, ident.token, 0), "class")


def _stored_under(obj) -> str | None:
    """The global name ``obj`` is stored under where it was defined, if any."""
    name = obj.__name__
    scope = getattr(obj, "__globals__", None) or namespace()
    return name if obj.__qualname__ == name and scope.get(name) is obj else None


# -- receiving ---------------------------------------------------------------------


def _known(origin: str, token: int, version: int = 0):
    """This process's object for a definition, or None if it must be built."""
    if origin == REGISTRY.origin:
        return REGISTRY.own.get(token)
    found = REGISTRY.received.get((origin, token))
    if found is not None and REGISTRY.identities[found].version == version:
        return found
    return None


def _filed(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` (and the code objects in it) under the file name it was made in."""
    consts = tuple(_filed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _load_code(payload: bytes) -> types.CodeType:
    """The code a full send carries, under its cell's file name, its lines kept."""
    code, filename, lines = pickle.loads(payload)
    _keep_lines(filename, lines)
    return _filed(code, filename)


def _function_shell(origin: str, token: int, version: int, name: str | None, payload: bytes,
                    fname: str, qualname: str, doc: str | None, digest: bytes = b""):
    with REGISTRY.lock:
        found = _known(origin, token, version)
        if found is not None:
            if digest not in REGISTRY.codes:  # the sender will name it by digest from now on
                REGISTRY.codes[digest] = _load_code(payload)
            return _pin(found, origin, token, version, name)
        code = REGISTRY.codes[digest] = _load_code(payload)
        built = _build_function(origin, token, version, name, code, payload, digest, fname, qualname, doc)
        return _pin(built, origin, token, version, name)


def _function_shell_by_digest(origin: str, token: int, version: int, name: str | None, digest: bytes,
                              fname: str, qualname: str, doc: str | None):
    """``_function_shell`` of a code this process was sent before, named by its digest."""
    with REGISTRY.lock:
        found = _known(origin, token, version)
        if found is not None:
            return _pin(found, origin, token, version, name)
        code = REGISTRY.codes.get(digest)
        if code is None:
            raise _never_sent(f"the code of {qualname} (digest {digest.hex()})")
        payload = (REGISTRY.code_payloads.get(code, (b"", b""))[0]
                   or cloudpickle.dumps((code, code.co_filename, None)))
        built = _build_function(origin, token, version, name, code, payload, digest, fname, qualname, doc)
        return _pin(built, origin, token, version, name)


def _pinned_function(key: tuple, what: str = "function"):
    """A top-level function (or ``what``: a class, see ``reduce_class``) this process was
    sent in full before (see ``_by_identity``)."""
    found = REGISTRY.pinned.get(key)
    if found is None:
        raise _never_sent(f"a notebook {what} (origin {key[0]}, token {key[1]})")
    return found


def _never_sent(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(f"{what} was never sent to this process; its sender believed it was. "
                                  "Start a new cluster (%rpc_shutdown, then %rpc_init) if this repeats")


def _touch(func: types.FunctionType, uses: tuple) -> None:
    """The definitions ``func`` uses were made current as they were unpickled."""


def _pin(func, origin: str, token: int, version: int, name: str | None):
    if name is not None:
        REGISTRY.pinned[(origin, token, version)] = func
    return func


def _plain_function(*args):
    """A function with no state (see ``reduce_function``), built and bound."""
    return _bound(_function_shell(*args))


def _plain_function_by_digest(*args):
    return _bound(_function_shell_by_digest(*args))


def _bound(func: types.FunctionType) -> types.FunctionType:
    if func in REGISTRY.unbuilt:
        _bind_function(func, (None, None, None, {}, {}, {}))
    return func


def _build_function(origin, token, version, name, code, payload, digest, fname, qualname, doc):
    closure = tuple(cp.make_empty_cell() for _ in code.co_freevars) or None
    func = types.FunctionType(code, namespace(), fname, None, closure)
    func.__qualname__, func.__module__, func.__doc__ = qualname, "__main__", doc
    _remember(func, origin, token, version, name, code, payload, digest)
    return func


def _bind_function(func: types.FunctionType, state: tuple) -> None:
    defaults, kwdefaults, closure, attributes, annotations, fills = state
    with REGISTRY.lock:
        if func not in REGISTRY.unbuilt:  # this process's own, or built before: as it is here
            return
        func.__defaults__, func.__kwdefaults__ = defaults, kwdefaults
        if attributes:
            func.__dict__.update(attributes)
        func.__annotations__ = annotations
        for cell, value in zip(func.__closure__ or (), closure or ()):
            if value is not cp.EMPTY_CELL:
                cell.cell_contents = value
        _fill(func.__globals__, fills)
        _store(func)


def _class_shell(origin: str, token: int, name: str | None, metaclass: type, cname: str,
                 bases: tuple, type_kwargs: dict):
    with REGISTRY.lock:
        found = _known(origin, token)
        if found is not None:
            return _pin(found, origin, token, 0, name)
        cls = types.new_class(cname, bases, {"metaclass": metaclass},
                              lambda body: body.update(type_kwargs))
        _remember(cls, origin, token, 0, name)
        return _pin(cls, origin, token, 0, name)


def _bind_class(cls: type, state: tuple) -> type:
    with REGISTRY.lock:
        if cls in REGISTRY.unbuilt:  # a class seen before keeps its class-level state
            cp.set_class_state(cls, state)
        _store(cls)
    return cls


def _remember(obj, origin: str, token: int, version: int, name: str | None,
              code=None, payload: bytes = b"", digest: bytes = b"") -> None:
    REGISTRY.unbuilt.add(obj)
    if origin != REGISTRY.origin:
        names = () if code is None else tuple(cp.code_globals(code))
        REGISTRY.identities[obj] = Identity(origin, token, version, code, payload, digest, names)
        if code is not None:  # forwarded as it came, by digest where the receiver has it
            REGISTRY.code_payloads.setdefault(code, (payload, digest))
        REGISTRY.received[(origin, token)] = obj
    REGISTRY.names[obj] = name


def _store(obj) -> None:
    """Put a newly built definition under its name, unless the name holds something else."""
    if obj not in REGISTRY.unbuilt:
        return
    REGISTRY.unbuilt.discard(obj)
    name = REGISTRY.names.pop(obj, None)
    if name is None or REGISTRY.identities.get(obj) is None:  # not top-level, or a detached copy
        return
    ns = namespace()
    current = ns.get(name)
    if current is None or _same_definition(current, obj):
        ns[name] = obj


def _same_definition(current, arriving) -> bool:
    """Whether ``current`` is an earlier version of the definition ``arriving`` (same
    origin and name): then the newer one replaces it."""
    try:
        ident = REGISTRY.identities.get(current)
    except TypeError:
        return False
    return ident is not None and ident.origin == REGISTRY.identities[arriving].origin


def _fill(scope: dict, fills: dict) -> None:
    for name, value in fills.items():
        if name not in scope:
            scope[name] = value

