"""Per-process primitives in a notebook definition's globals: a lock, condition, event or
semaphore a function uses arrives as a fresh one, as an import would make it in each
process of a script."""

from __future__ import annotations

import threading
from collections.abc import Callable

# The per-process objects a global may hold, and the recipe for a fresh one like it.
PER_PROCESS: dict[type, Callable] = {
    type(threading.Lock()): lambda old: (threading.Lock, ()),
    type(threading.RLock()): lambda old: (threading.RLock, ()),
    threading.Condition: lambda old: (threading.Condition, ()),
    threading.Event: lambda old: (threading.Event, ()),
    threading.Semaphore: lambda old: (threading.Semaphore, (old._value,)),
    threading.BoundedSemaphore: lambda old: (threading.BoundedSemaphore, (old._initial_value,)),
}


def fresh(value):
    """What travels for ``value``: itself, or a recipe for a fresh one of its kind."""
    recipe = PER_PROCESS.get(type(value))
    return value if recipe is None else _Fresh(recipe(value))


class _Fresh:
    """A per-process object in transit: what arrives is a new one of the same kind."""

    def __init__(self, recipe: tuple):
        self.recipe = recipe

    def __reduce__(self):
        return self.recipe
