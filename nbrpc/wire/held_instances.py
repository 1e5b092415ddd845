"""An instance of a notebook class its receiver holds, for the C route (``c_pickling``).

The kept pickler sends such an instance as pickle sends any object (``__reduce_ex__``:
``copyreg.__newobj__``, the class, its ``__dict__``), the class by identity where the
receiver holds it or made it (``definitions.reduce_class``). The C pickler would write
the class by name, a global of ``__main__``; ``held`` gives it a reducer of the same
reduction with the class's identity in the class's place (``instance_of``: one global
where ``copyreg.__newobj__`` of the class by identity would take two, and each global
costs a message an import's lookup on each side), where the instance's class is plain and held.
"""

from __future__ import annotations

import copyreg
import os
import pickle
from collections.abc import Callable

import cloudpickle

from . import definitions, module_globals
from .receivers import receivers

_AS_OBJECT = (object.__reduce_ex__, object.__reduce__, object.__getstate__)
# class -> (its __mro__, its key by identity, its instances' reducer), the last two
# None where it is not a plain notebook class: told once per class (and again if its
# bases change), for ``KINDS_KEPT`` classes at most (a class made in a loop makes one
# each time). A forked child starts without (its definitions have another origin:
# ``definitions.REGISTRY``).
_KINDS: dict[type, tuple] = {}
KINDS_KEPT = 1024
os.register_at_fork(after_in_child=_KINDS.clear)


def held(obj, cls: type) -> tuple[dict, Callable] | None:
    """``obj``'s ``__dict__`` and its class's reducer for the C pickler's table, where
    ``obj`` is no module's global and an instance of a top-level notebook class that the
    message's receiver holds (or made: a reply going home), made by ``type`` of notebook
    classes alone (no builtin's layout, no slots) and reduced as ``object`` reduces (no
    ``copyreg`` reducer); else None. Asked of every such instance in every message: what
    can change after a class is made (its name, its place in ``__main__``, its reducers)
    is asked each time, in one pass."""
    kind = _KINDS.get(cls)
    if kind is None or kind[0] is not cls.__mro__:
        if len(_KINDS) >= KINDS_KEPT:
            _KINDS.clear()
        kind = _KINDS[cls] = (cls.__mro__, *_plain_kind(cls))
    key = kind[1]
    name = cls.__name__
    if (key is None or cls.__module__ != "__main__" or cls.__qualname__ != name
            or cls in copyreg.dispatch_table
            or (cls.__reduce_ex__, cls.__reduce__, cls.__getstate__) != _AS_OBJECT
            or definitions.namespace().get(name) is not cls or not receivers.holds_class(key)):
        return None
    found = getattr(obj, "__dict__", None)
    if type(found) is not dict or module_globals.find(obj) is not None:
        return None
    return found, kind[2]


def _plain_kind(cls: type) -> tuple[tuple | None, Callable | None]:
    """The key by which a notebook class made by ``type`` of notebook classes alone, none
    with slots, goes by identity (``definitions.class_identity``), and its instances'
    reducer; None and None for any other class."""
    if type(cls) is not type:
        return None, None
    for base in cls.__mro__[:-1]:
        if not definitions.is_notebook_definition(base) or "__slots__" in vars(base):
            return None, None
    key = definitions.class_identity(cls)[1][0]
    return key, _reducer(cls, key)


def _reducer(cls: type, key: tuple) -> Callable:
    """The reduction pickle makes of an instance of ``cls``, the class by identity (its
    ``key``: ``instance_of``); an instance reduced otherwise (its own ``__reduce_ex__``,
    ``__getnewargs__``) fails, for the kept pickler to send."""
    args, newobj, plain = (key,), copyreg.__newobj__, (cls,)

    def reduce(obj) -> tuple:
        reduced = obj.__reduce_ex__(cloudpickle.DEFAULT_PROTOCOL)
        if reduced[0] is not newobj or reduced[1] != plain:
            raise pickle.PicklingError(f"{cls.__qualname__} reduces otherwise")
        return (instance_of, args) + reduced[2:]
    return reduce


def instance_of(key: tuple):
    """``copyreg.__newobj__`` of the notebook class this process holds as ``key``: a new
    instance, its state set after (pickle's BUILD)."""
    cls = definitions.REGISTRY.pinned.get(key)
    if cls is None:
        raise NotHeld(f"an instance's notebook class (origin {key[0]}, token {key[1]}) was never sent to this "
                      "process; its sender believed it was. Start a new cluster (%rpc_shutdown, then %rpc_init) "
                      "if this repeats")
    return cls.__new__(cls)


class NotHeld(pickle.UnpicklingError):
    """An instance names a class this process does not hold (``instance_of``): in a fetched
    RRef's value, which its owner sends each holder alike (``c_pickling.fetched_message``),
    the value is fetched again, in full (``calls.wrappers``)."""
