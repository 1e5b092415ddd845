"""What each receiver of this process's calls holds of its notebook code, and where the
call being pickled on this thread goes (``definitions`` asks, the calls layer tells)."""

from __future__ import annotations

import threading
import weakref

# How many (function, receiver) pairs ``Receivers.held`` keeps at most.
FUNCTIONS_KEPT = 1024


class Receivers:
    """Which code digests and top-level functions (by origin, token and version) each
    receiver, by worker name, is known to hold, and where the call being pickled on this
    thread goes.

    A receiver keeps every code it is sent (``definitions.REGISTRY.codes``: one entry per
    distinct code, not per function object, so lambdas made in a loop share one) and
    every top-level function (``REGISTRY.pinned``), so what it acknowledged stays
    valid for its life; ``forget`` drops everything known when
    the group's members change (a new cluster may reuse a name).
    """

    def __init__(self):
        self.known: dict[str, set] = {}
        self.local = threading.local()
        self.lock = threading.Lock()
        # (id() of a function, receiver) -> what ``held`` checks, and the function's reduction.
        self.functions: dict[tuple, tuple] = {}

    def begin(self, name: str | None) -> None:
        """The call pickled next on this thread goes to ``name`` (None: unknown)."""
        self.local.to, self.local.fresh = name, None

    def end(self) -> list | None:
        """The call is pickled: the digests it carried in full (to acknowledge), or None."""
        fresh = self.local.fresh
        self.local.to = self.local.fresh = None
        return fresh

    def holds(self, digest) -> bool:
        """Whether the destination of the call being pickled holds ``digest``; if not,
        the code goes in full and is noted for ``acknowledged``."""
        to = getattr(self.local, "to", None)
        if to is None:
            return False
        if digest in self.known.get(to, ()):
            return True
        if self.local.fresh is None:
            self.local.fresh = []
        self.local.fresh.append(digest)
        return False

    def remember(self, func, name: str, key: tuple, reduction: tuple) -> None:
        """The destination of the call being pickled holds top-level ``func`` (stored under
        ``name``, held as ``key``), which uses no global: ``reduction`` (its identity alone)
        is what it is sent while that holds (``held``)."""
        if len(self.functions) >= FUNCTIONS_KEPT:  # (of functions long gone, mostly)
            self.functions.clear()
        self.functions[id(func), self.local.to] = (weakref.ref(func), func.__code__, name, key, reduction)

    def held(self, func) -> tuple | None:
        """``func``'s reduction as ``remember`` kept it for the destination of the call being
        pickled, while it is still that: the same function, code and name, still held
        there; else None (``definitions.reduce_function`` says)."""
        to = getattr(self.local, "to", None)
        entry = self.functions.get((id(func), to))
        if entry is None:
            return None
        ref, code, name, key, reduction = entry
        if (ref() is func and code is func.__code__ and func.__qualname__ == name
                and func.__globals__.get(name) is func and key in self.known.get(to, ())):
            return reduction
        return None

    def acknowledged(self, name: str, digests: list[bytes]) -> None:
        """``name`` answered a call that carried ``digests`` in full: it holds them."""
        with self.lock:
            self.known.setdefault(name, set()).update(digests)

    def forget(self) -> None:
        with self.lock:
            self.known.clear()
            self.functions.clear()

    def reset(self) -> None:
        """A forked child: nothing known, no call being pickled (in place: other
        modules hold this object)."""
        self.known = {}
        self.local = threading.local()
        self.lock = threading.Lock()
        self.functions = {}


receivers = Receivers()
