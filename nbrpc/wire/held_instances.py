"""An instance of a notebook class its receiver holds, for the C route (``c_pickling``).

The kept pickler sends such an instance as pickle sends any object (``__reduce_ex__``:
``copyreg.__newobj__``, the class, its ``__dict__``), the class by identity where the
receiver holds it or made it (``definitions.reduce_class``). The C pickler would write
the class by name, a global of ``__main__``; ``c_pickling`` gives it the same reduction
with the class's identity in the class's place (``new``), where ``state`` found the
instance's class plain and held.
"""

from __future__ import annotations

import copyreg
import os

from . import definitions, module_globals

_AS_OBJECT = (object.__reduce_ex__, object.__reduce__, object.__getstate__)
# class -> (its __mro__, its reduction by identity, or None where it is not a plain
# notebook class): told once per class (and again if its bases change), for
# ``KINDS_KEPT`` classes at most (a class made in a loop makes one each time). A forked
# child starts without (its definitions have another origin: ``definitions.REGISTRY``).
_KINDS: dict[type, tuple] = {}
KINDS_KEPT = 1024
os.register_at_fork(after_in_child=_KINDS.clear)


def state(obj, cls: type) -> tuple[dict, tuple] | None:
    """``obj``'s ``__dict__`` and its class's reduction by identity, where ``obj`` is no
    module's global and an instance of a top-level notebook class that the message's
    receiver holds (or made: a reply going home), made by ``type`` of notebook classes
    alone (no builtin's layout, no slots) and reduced as ``object`` reduces (no
    ``copyreg`` reducer); else None."""
    kind = _KINDS.get(cls)
    if kind is None or kind[0] is not cls.__mro__:
        if len(_KINDS) >= KINDS_KEPT:
            _KINDS.clear()
        kind = _KINDS[cls] = (cls.__mro__, _plain_kind(cls))
    by_identity = kind[1]
    if (by_identity is None or cls.__module__ != "__main__" or cls in copyreg.dispatch_table
            or (cls.__reduce_ex__, cls.__reduce__, cls.__getstate__) != _AS_OBJECT
            or not definitions.held_by_receiver(cls, by_identity)):
        return None
    found = getattr(obj, "__dict__", None)
    if type(found) is not dict or module_globals.find(obj) is not None:
        return None
    return found, by_identity


def _plain_kind(cls: type) -> tuple | None:
    """The reduction by identity of a notebook class made by ``type`` of notebook classes
    alone, none with slots; None for any other class."""
    if type(cls) is not type:
        return None
    for base in cls.__mro__[:-1]:
        if not definitions.is_notebook_definition(base) or "__slots__" in vars(base):
            return None
    return definitions.class_identity(cls)


def new(cls: type, *args):
    """``copyreg.__newobj__`` by another name: the C pickler takes the first argument of a
    function of that name for a class, where ``c_pickling`` puts the class's identity."""
    return cls.__new__(cls, *args)
