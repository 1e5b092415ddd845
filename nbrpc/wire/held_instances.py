"""An instance of a notebook class its receiver holds, for the C route (``c_pickling``).

The kept pickler sends such an instance as pickle sends any object (``__reduce_ex__``:
``copyreg.__newobj__``, the class, its ``__dict__``), the class by identity where the
receiver holds it or made it (``definitions.reduce_class``). The C pickler would write
the class by name, a global of ``__main__``; ``held`` gives it a reducer of the same
reduction with the class's identity in the class's place (``new``), where the instance's
class is plain and held.
"""

from __future__ import annotations

import copyreg
import os
import pickle
from collections.abc import Callable

import cloudpickle

from . import definitions, module_globals
from .reductions import Reduced

_AS_OBJECT = (object.__reduce_ex__, object.__reduce__, object.__getstate__)
# class -> (its __mro__, its reduction by identity, its instances' reducer), the last two
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
    ``copyreg`` reducer); else None."""
    kind = _KINDS.get(cls)
    if kind is None or kind[0] is not cls.__mro__:
        if len(_KINDS) >= KINDS_KEPT:
            _KINDS.clear()
        kind = _KINDS[cls] = (cls.__mro__, *_plain_kind(cls))
    if (kind[1] is None or cls.__module__ != "__main__" or cls in copyreg.dispatch_table
            or (cls.__reduce_ex__, cls.__reduce__, cls.__getstate__) != _AS_OBJECT
            or not definitions.held_by_receiver(cls, kind[1])):
        return None
    found = getattr(obj, "__dict__", None)
    if type(found) is not dict or module_globals.find(obj) is not None:
        return None
    return found, kind[2]


def _plain_kind(cls: type) -> tuple[tuple | None, Callable | None]:
    """The reduction by identity of a notebook class made by ``type`` of notebook classes
    alone, none with slots, and its instances' reducer; None and None for any other class."""
    if type(cls) is not type:
        return None, None
    for base in cls.__mro__[:-1]:
        if not definitions.is_notebook_definition(base) or "__slots__" in vars(base):
            return None, None
    by_identity = definitions.class_identity(cls)
    return by_identity, _reducer(cls, Reduced(by_identity))


def _reducer(cls: type, by_identity: Reduced) -> Callable:
    """The reduction pickle makes of an instance of ``cls``, the class by identity; an
    instance reduced otherwise (its own ``__reduce_ex__``, ``__getnewargs__``) fails,
    for the kept pickler to send."""
    args, newobj, plain = (by_identity,), copyreg.__newobj__, (cls,)

    def reduce(obj) -> tuple:
        reduced = obj.__reduce_ex__(cloudpickle.DEFAULT_PROTOCOL)
        if reduced[0] is not newobj or reduced[1] != plain:
            raise pickle.PicklingError(f"{cls.__qualname__} reduces otherwise")
        return (new, args) + reduced[2:]
    return reduce


def new(cls: type, *args):
    """``copyreg.__newobj__`` by another name: the C pickler takes the first argument of a
    function of that name for a class, where ``c_pickling`` puts the class's identity."""
    return cls.__new__(cls, *args)


class NotHeld(pickle.UnpicklingError):
    """A fetched RRef's value names a class this process does not hold (``checked_first``):
    fetched again, in full (``calls.wrappers``)."""


def checked_first(value, instances: dict) -> Reduced:
    """``value``, whose held classes' ``instances`` (class -> reducer) go by identity to a
    receiver that may not hold them: the receiver checks that it does before it unpickles
    anything of ``value`` (``_after``, ``holds_all``)."""
    keys = tuple(_KINDS[cls][1][1][0] for cls in instances)  # (_pinned_function, (key, "class"))
    return Reduced((_after, (Reduced((holds_all, (keys,))), value)))


def holds_all(keys: tuple) -> None:
    """Raises ``NotHeld`` unless this process holds each of the classes ``keys`` name."""
    pinned = definitions.REGISTRY.pinned
    for key in keys:
        if key not in pinned:
            raise NotHeld(f"a fetched value's class (origin {key[0]}, token {key[1]}) was never sent to this process")


def _after(_checked, value):
    """``value``, once its classes were checked (``checked_first``)."""
    return value
