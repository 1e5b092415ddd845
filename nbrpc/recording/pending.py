"""Each member's calls in flight and calls being served, always on.

Parts:

- ``Pending``: one per process (``PENDING``). The calls layer tells it of every call
  this member makes (``calling`` when it is sent, ``answered`` when its reply came or
  its caller gave up) and every call it serves (``serving``, ``served``:
  ``interrupts.Stoppable`` runs each Python function a caller sends), and every call
  whose ``@async_execution`` function returned a future not yet complete (``awaiting``,
  ``settled``: ``interrupts.Awaited``). ``report`` copies them for ``diagnostics.waits``,
  which joins every member's copy into a wait-for graph.
- ``call_site``: the frame that made a call, outside nbrpc's and torch's own modules:
  a notebook cell's file and line. A call answered before its caller returns keeps its
  caller's frame instead, read only when the table is (``site_of``).

Bookkeeping runs inside every call, so an entry is a tuple in a dict keyed by call
id (a dict's insert and pop are atomic under the GIL: no lock on the call's path),
and nothing runs between calls.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable

import torch

from .._compat import torch_compat
from .._util import Hooks

# Frames in these folders are nbrpc's or torch's own, never a call's site.
OWN_FOLDERS = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
               os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)

# On every call's path: one global lookup each.
_getframe, _get_ident, _now = sys._getframe, threading.get_ident, time.time

# The slots of an outgoing entry: call id, callee, what runs, site ((file, line), or the
# caller's frame: ``site_of``), thread ident, since (time.time()), how it was made, the call it waits on instead
# (``to_here``: the ``remote`` that makes the value).
ID, CALLEE, FUNCTION, SITE, THREAD, SINCE, KIND, ON = range(8)
# The slots of a served entry: call id, what runs, thread ident, since.
S_ID, S_FUNCTION, S_THREAD, S_SINCE = range(4)
# The slots of an awaited entry: call id, the @async_execution function, where its
# future was made ((code, offset) or None), since it returned that future unset.
A_ID, A_FUNCTION, A_MADE, A_SINCE = range(4)


def call_site(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the first frame from the caller's ``depth`` up that is neither
    nbrpc's nor torch's (a cell, or a module of the user's). A wrapper the user calls
    directly passes its caller's depth (2), so that the usual call looks at one frame."""
    return _first_outside(sys._getframe(depth))


def _first_outside(frame: types.FrameType | None) -> tuple[str, int] | None:
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(OWN_FOLDERS):
            return name, frame.f_lineno
        frame = frame.f_back
    return None


def site_line(site: tuple | None) -> tuple[str, int] | None:
    """A call site as (file, line), given so (``call_site``) or as (code, instruction
    offset), which ``rref_ledger`` takes since reading the line costs every RRef's life."""
    if site is None or not isinstance(site[0], types.CodeType):
        return site
    code, offset = site
    line = next((line for start, end, line in code.co_lines() if start <= offset < end), None)
    return code.co_filename, line or code.co_firstlineno


def site_of(site: tuple | types.FrameType | None) -> tuple[str, int] | None:
    """An entry's call site as (file, line): as given, or found from the frame the entry
    keeps (its caller's, still running: the entry goes before that frame returns)."""
    if type(site) is types.FrameType:
        return _first_outside(site)
    return site


def _listed(site: tuple | None) -> list | None:
    return list(site) if site else None


def function_name(func: Callable | str) -> str:
    if isinstance(func, str):
        return func
    qualname = getattr(func, "__qualname__", None)
    if qualname is None or qualname.startswith("_"):  # torch.add: "_VariableFunctionsClass.add"
        return getattr(func, "__name__", None) or qualname or repr(func)
    return qualname


class Pending:
    """This member's calls in flight (``outgoing``) and calls it serves (``served``)."""

    def __init__(self) -> None:
        # Registered explainers: call key -> what the call waits on, in words, or None
        # (the driver's diagnostics); timeouts and interrupts quote them.
        self.explainers = Hooks()
        self.reset()

    def reset(self) -> None:
        """Forget every call (a new member, after a fork)."""
        self.outgoing: dict[str, tuple] = {}
        self.served: dict[str, tuple] = {}
        # Calls whose @async_execution function returned a future not yet complete.
        self.awaited: dict[str, tuple] = {}
        # id(PyRRef) -> the call id of the remote() that makes its value.
        self.rrefs: dict[int, str] = {}
        # call id -> (weak reference to its PyRRef, its id()) of each remote() in ``outgoing``.
        self.remotes: dict[str, tuple] = {}
        self._remotes_lock = threading.Lock()
        self._ids = itertools.count()
        self._id_prefix = f"{os.getpid()}-n"  # getpid is a system call: not on each call's path

    def calling(self, callee, func, call_id: str | None, kind: str, on: str | None = None,
                site: bool | tuple = True) -> str:
        """A call was sent; returns its key for ``answered``. ``kind``: ``rpc_sync``,
        ``rpc_async``, ``remote``, ``to_here``, ``backward``, or ``rpc_on`` (a cell run on
        the callee's kernel, which waits on whatever that kernel's main thread calls).
        ``site``: the one given (file, line), none (False), or (True) the caller's frame,
        kept and read only when the table is: for a call answered before its caller
        returns (a frame kept past its return would keep its variables alive)."""
        key = call_id or self._id_prefix + str(next(self._ids))
        name = callee if type(callee) is str else getattr(callee, "name", str(callee))
        where = _getframe(1) if site is True else (site or None)
        self.outgoing[key] = (key, name, func, where, _get_ident(), _now(), kind, on)
        return key

    def fetching(self, owner: str, rref) -> tuple[str, str | None]:
        """A ``to_here`` of ``rref`` from ``owner`` was sent (``calling`` for it, in one step):
        its key for ``answered``, and that of the ``remote`` making the value, which it
        waits on, unless it is known to be over (``fetched`` once the value came). One
        frame: what runs between a ``remote`` and its fetch delays the fetch (see
        ``remote_sending``)."""
        on = self.rrefs.get(id(rref))
        if on is not None and on not in self.remotes:  # over (dropped as the table was read)
            self.rrefs.pop(id(rref), None)
            on = None
        key = self._id_prefix + str(next(self._ids))
        self.outgoing[key] = (key, owner, "to_here", _getframe(1), _get_ident(), _now(), "to_here", on)
        return key, on

    def answered(self, key: str) -> None:
        self.outgoing.pop(key, None)

    def forget_calls_to(self, callees) -> None:
        """Drop the calls in flight to these members (they left: no answer will come, and a
        later cluster may reuse their names)."""
        gone = set(callees)
        for key, call in list(self.outgoing.items()):
            if call[CALLEE] in gone:
                self.outgoing.pop(key, None)

    def serving(self, call_id: str, func) -> None:
        self.served[call_id] = (call_id, func, threading.get_ident(), time.time())

    def done(self, call_id: str) -> None:
        self.served.pop(call_id, None)

    def awaiting(self, call_id: str, func, made: tuple | None) -> None:
        """Call ``call_id``'s ``@async_execution`` function returned a future that is not
        complete (made at ``made``): its reply leaves when the future completes."""
        self.awaited[call_id] = (call_id, func, made, time.time())

    def settled(self, call_id: str) -> bool:
        """Call ``call_id``'s future completed (or its caller gave up); False if unknown."""
        return self.awaited.pop(call_id, None) is not None

    def remote_sending(self, callee, func, call_id: str | None, site: tuple | None) -> str:
        """A ``remote`` is about to be sent; returns its key for ``remote_made`` (or
        ``answered``, if it is not sent). Its entry is made now, and the oldest calls whose
        RRef is confirmed dropped: each microsecond between a ``remote`` and the
        ``to_here`` after it delays the fetch's request, and on a busy 2-core machine
        8 us there cost the pair about 40 us of latency."""
        if self.remotes:
            self._drop_created(everything=False)
        return self.calling(callee, func, call_id, "remote", site=site)

    def remote_made(self, key: str, rref) -> None:
        """The ``remote`` ``key`` made ``rref``: it is in flight until its owner confirms
        the RRef (torch's creation future is done: the function ran). No callback marks
        that (a torch thread would take the GIL for it after every ``remote``), and the
        future is asked for only then: ``in_flight`` and the next ``remote_sending`` drop
        the calls whose future is done, or whose RRef is gone (nothing waits on them). No
        lock: ``_drop_created`` walks a copy and drops only what it saw."""
        self.rrefs[id(rref)] = key
        self.remotes[key] = (weakref.ref(rref), id(rref))

    def fetched(self, remote_key: str) -> None:
        """The value of the ``remote`` ``remote_key`` arrived here (``to_here``): its function
        ran, so the call is over. Dropped now, the usual ``remote`` + ``to_here`` leaves the
        next ``remote_sending`` nothing to look at. No lock: ``_drop_created`` walks a copy,
        and this RRef, alive, keeps its id() from another's."""
        made = self.remotes.pop(remote_key, None)
        self.outgoing.pop(remote_key, None)
        if made is not None and self.rrefs.get(made[1]) == remote_key:
            self.rrefs.pop(made[1], None)

    def _drop_created(self, everything: bool = True) -> None:
        """Drop the ``remote`` calls whose RRef their owner confirmed: all of them, or
        (``everything`` False) the oldest ones, up to the first still in flight."""
        if not self.remotes:
            return
        with self._remotes_lock:
            over = []
            for key, (ref, rref_id) in list(self.remotes.items()):
                rref = ref()
                if rref is None or key not in self.outgoing or torch_compat.creation_future(rref).done():
                    over.append((key, rref_id))
                elif not everything:
                    break
            for key, rref_id in over:
                self.remotes.pop(key, None)
                self.outgoing.pop(key, None)
                if self.rrefs.get(rref_id) == key:
                    self.rrefs.pop(rref_id, None)

    def in_flight(self) -> list[tuple]:
        """The entries of the calls in flight now."""
        self._drop_created()
        return list(self.outgoing.copy().values())

    def report(self) -> dict:
        """Both tables as plain data (function names, no objects)."""
        outgoing = [
            {"id": e[ID], "callee": e[CALLEE], "function": function_name(e[FUNCTION]),
             "site": _listed(site_of(e[SITE])), "thread": e[THREAD],
             "since": e[SINCE], "kind": e[KIND], "on": e[ON]}
            for e in self.in_flight()
        ]
        served = [
            {"id": e[S_ID], "function": function_name(e[S_FUNCTION]), "thread": e[S_THREAD],
             "since": e[S_SINCE]}
            for e in self.served.copy().values()
        ]
        awaited = []
        for e in self.awaited.copy().values():
            made = site_line(e[A_MADE])
            awaited.append({"id": e[A_ID], "function": function_name(e[A_FUNCTION]),
                            "made": list(made) if made else None, "since": e[A_SINCE]})
        return {"pid": os.getpid(), "main_thread": threading.main_thread().ident,
                "outgoing": outgoing, "served": served, "awaited": awaited}

    def explain(self, key: str) -> str:
        """What call ``key`` waits on, in words, from the registered explainers ("" if none)."""
        for explainer in self.explainers:
            try:
                text = explainer(key)
            except Exception:  # a diagnosis must never hide the error it explains
                text = None
            if text:
                return text
        return ""

    def explained(self, key: str | None) -> str:
        """What call ``key`` waited on, as a sentence to add to its error ("" if unknown)."""
        text = self.explain(key) if key is not None else ""
        return f". When it stopped: {text}" if text else ""

    def oldest(self, thread: int | None = None) -> float | None:
        """When the oldest call in flight (made by ``thread``, or any) was sent."""
        times = [e[SINCE] for e in self.in_flight() if thread is None or e[THREAD] == thread]
        return min(times) if times else None


PENDING = Pending()
os.register_at_fork(after_in_child=PENDING.reset)  # a forked child makes none of its parent's calls
