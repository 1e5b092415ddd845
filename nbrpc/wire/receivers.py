"""What each receiver of this process's calls holds of its notebook code, and where the
call or reply being pickled on this thread goes (``definitions`` asks, the calls layer tells)."""

from __future__ import annotations

import threading
import weakref

# How many (function, receiver) pairs ``Receivers.held`` keeps at most.
FUNCTIONS_KEPT = 1024


class _Pickling(threading.local):
    """Where this thread's message goes: ``to``, a call's receiver by name, with the
    digests it carried in full (``fresh``); ``reply``, the value a served call answers and
    its caller's origin (``replying``); ``home``, that origin while the reply is pickled;
    ``fetched``, while an RRef's value is pickled for a fetch by any of its holders."""

    to: str | None = None
    fresh: list | None = None
    reply: tuple | None = None
    home: str | None = None
    fetched: bool = False


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
        self.local = _Pickling()
        self.lock = threading.Lock()
        # (id() of a function, receiver) -> what ``held`` checks, and the function's reduction.
        self.functions: dict[tuple, tuple] = {}
        # id() of a notebook class's instance a remote made here -> a weak reference to it.
        self.owned: dict[int, weakref.ref] = {}

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
        to = self.local.to
        if to is None:
            return False
        if digest in self.known.get(to, ()):
            return True
        if self.local.fresh is None:
            self.local.fresh = []
        self.local.fresh.append(digest)
        return False

    def holds_class(self, key) -> bool:
        """Whether the message pickled now may name top-level notebook class ``key`` by
        identity (``definitions.reduce_class``): its receiver holds it, or made it (a reply
        going home), or it is an RRef's value for any fetcher (``fetching``)."""
        local = self.local
        return key in self.known.get(local.to, ()) or local.home == key[0] or local.fetched

    def owning(self, value) -> None:
        """``value``, an instance of a notebook class, is the value of an RRef owned here
        (a remote's): torch pickles it for any of the RRef's holders (``is_owned``)."""
        key = id(value)
        try:
            self.owned[key] = weakref.ref(value, lambda _: self.owned.pop(key, None))
        except TypeError:  # (slots without __weakref__): fetched in full
            pass

    def is_owned(self, obj) -> bool:
        """Whether ``obj`` is the value of an RRef owned here (``owning``): pickled with no
        caller named, it is a fetch's (``to_here``) reply."""
        ref = self.owned.get(id(obj))
        return ref is not None and ref() is obj

    def fetching(self, on: bool) -> None:
        """An RRef's value is pickled now for a fetch, by a process this one cannot tell
        (``c_pickling.fetched_message``): its top-level classes go by identity (``holds_class``;
        the fetcher checks that it holds them, and fetches again in full if not)."""
        self.local.fetched = on

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
        to = self.local.to
        entry = self.functions.get((id(func), to))
        if entry is None:
            return None
        ref, code, name, key, reduction = entry
        if (ref() is func and code is func.__code__ and func.__qualname__ == name
                and func.__globals__.get(name) is func and key in self.known.get(to, ())):
            return reduction
        return None

    def replying(self, value, origin: str) -> None:
        """A served call answers ``value`` to the process of definitions origin ``origin``
        (its caller): the reply pickled next on this thread, if it is ``value``, goes there."""
        self.local.reply = (value, origin)

    def reply_home(self, obj) -> str | None:
        """This thread pickles ``obj``, not a call: if it is the reply ``replying`` named,
        its caller's origin, where the reply now goes (``made_by_receiver``, until
        ``going_home(None)``); else None. The note is dropped either way, so that no value
        outlives its reply here."""
        local = self.local
        reply, local.reply = local.reply, None
        if reply is None or reply[0] is not obj:
            return None
        local.home = reply[1]
        return reply[1]

    def going_home(self, origin: str | None) -> None:
        """The reply pickled now goes to the process of ``origin`` (None: no longer)."""
        self.local.home = origin

    def made_by_receiver(self, origin: str) -> bool:
        """Whether the reply being pickled goes to the process of ``origin``: there a
        definition of that origin is the process's own (``definitions.reduce_class``)."""
        return self.local.home == origin

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
        self.local = _Pickling()
        self.lock = threading.Lock()
        self.functions = {}
        self.owned = {}


receivers = Receivers()
