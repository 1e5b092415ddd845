"""Objects that live in a module travel by reference, as the receiver's own.

A script cannot send ``os.environ``, ``sys.stdout`` or a bound method of one
(pickle refuses them); cloudpickle can, by value, and the receiver would then read a
copy of the sender's environment or write to a copy of its stream. An object that is
a module-level global of a module the receiver can import is sent as "that module's
global of that name" instead (``find``), and lands as the receiver's own object.

The parts:

- ``ModuleGlobals``: this process's index from an object's id to the module and name
  that hold it, grown as modules are imported, checked on every hit (the global may
  have been rebound, the object gone and its id reused). A function kept in such an
  object's own attributes under its name is found too (``find_attribute``), as that
  attribute of that global: while a cell runs, IPython's ``sys.stdout.write`` is a
  closure of its own, kept in the stream.
- What it leaves out: notebook code (``__main__``) and modules registered with
  cloudpickle to go by value; values whose identity means nothing (numbers, strings,
  tuples: pickle sends those before asking, as it does dicts, lists and sets); functions,
  classes and modules, which go by reference already; tensors and RRefs, which torch
  sends its own way (a tensor through its device maps, an RRef as a fork).
"""

from __future__ import annotations

import os
import sys
import threading
import types
import weakref

import cloudpickle
import torch

from .._compat import torch_compat

# Modules whose globals a receiver does not share: notebook code, a script's main.
UNSHARED = frozenset({"__main__", "__mp_main__"})
# Globals of these exact types are left out (see the module's docstring), and so are
# instances of the base classes after them. Types are read with type(), not
# isinstance, which would ask a module's deprecated stand-ins for __class__.
_LEFT_OUT = frozenset({
    type(None), bool, int, float, complex, str, bytes, bytearray, tuple, list, dict, set,
    frozenset, range, slice, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
    types.MethodType, types.MethodWrapperType, types.WrapperDescriptorType,
    types.MethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType,
    classmethod, staticmethod, property,
})
_LEFT_OUT_BASES = (type, types.ModuleType, types.FunctionType, torch.Tensor, torch_compat.PyRRef)


class ModuleGlobals:
    """This process's index of module-level globals by identity."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[int, tuple[str, str]] = {}  # id -> (module name, global name)
        # The own attributes of every global that has some, with its module and name.
        self._holders: list[tuple[dict, str, str]] = []
        self._not_held: weakref.WeakSet = weakref.WeakSet()  # functions find_attribute did not find
        self._indexed: set[str] = set()
        self._seen = 0  # len(sys.modules) at the last look

    def find(self, obj) -> tuple[types.ModuleType, str] | None:
        """``(module, name)`` if ``obj`` is that module's global ``name`` and the module
        is one a receiver can import, else None."""
        if len(sys.modules) != self._seen:
            self._index_new()
        held = self._held.get(id(obj))
        if held is None:
            return None
        module = sys.modules.get(held[0])
        if module is not None and _own(module).get(held[1]) is obj:
            return module, held[1]
        return None

    def find_attribute(self, function) -> tuple[object, str] | None:
        """``(holder, name)`` if ``function`` is kept in the own attributes of a module's
        global ``holder`` under its ``__name__``, else None. Looks at every such global
        (a few hundred microseconds), once per function: for functions that are neither
        importable nor a notebook's, which are rare."""
        if len(sys.modules) != self._seen:
            self._index_new()
        if function in self._not_held:
            return None
        name = getattr(function, "__name__", None)
        for own, module_name, global_name in self._holders:
            if own.get(name) is function:
                holder = _own(sys.modules.get(module_name)).get(global_name)
                if _own(holder) is own:
                    return holder, name
        self._not_held.add(function)
        return None

    def forked(self) -> None:
        """In a forked child: a new lock (another thread may have held the parent's); the
        index holds, since the child has the parent's objects at the same ids."""
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Forget everything (the index is rebuilt on the next ``find``)."""
        with self._lock:
            self._held.clear()
            self._holders.clear()
            self._not_held = weakref.WeakSet()
            self._indexed.clear()
            self._seen = 0

    def _index_new(self) -> None:
        with self._lock:
            modules = list(sys.modules.items())
            by_value = _registered_by_value()
            for name, module in modules:
                if name in self._indexed:
                    continue
                self._indexed.add(name)
                if shared(name, module, by_value):
                    self._index(name, module)
            self._seen = len(modules)

    def _index(self, module_name: str, module) -> None:
        items = list(_own(module).items())
        for name, value in items:
            kind = type(value)
            if name.startswith("__") or kind in _LEFT_OUT or issubclass(kind, _LEFT_OUT_BASES):
                continue
            key = id(value)
            # An object several modules hold goes by the plainest name (public, short).
            if key not in self._held or _plainer(module_name, self._held[key][0]):
                self._held[key] = (module_name, name)
            own = _own(value)
            if own:
                self._holders.append((own, module_name, name))


def shared(name: str, module, by_value: set[str]) -> bool:
    """Whether a receiver can import ``module`` under ``name`` and have the same globals."""
    if name in UNSHARED or not isinstance(module, types.ModuleType):
        return False
    if getattr(module, "__spec__", None) is None and name not in sys.builtin_module_names:
        return False  # made at run time (a notebook's module object, a shim)
    return not any(name == m or name.startswith(m + ".") for m in by_value)


def _plainer(name: str, than: str) -> bool:
    def rank(n: str) -> tuple:
        return (any(part.startswith("_") for part in n.split(".")), n.count("."), len(n), n)

    return rank(name) < rank(than)


def _own(obj) -> dict:
    """``obj``'s own attributes (its instance ``__dict__``), or {}; asks no ``__getattr__``."""
    try:
        own = object.__getattribute__(obj, "__dict__")
    except Exception:
        return {}
    return own if type(own) is dict else {}


def _registered_by_value() -> set[str]:
    return set(cloudpickle.list_registry_pickle_by_value())


# This process's index; a forked child shares the parent's objects at the same ids.
MODULE_GLOBALS = ModuleGlobals()
os.register_at_fork(after_in_child=MODULE_GLOBALS.forked)
find = MODULE_GLOBALS.find
find_attribute = MODULE_GLOBALS.find_attribute
