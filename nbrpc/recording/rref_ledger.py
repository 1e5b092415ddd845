"""RRef tracking in one member: who created, owns, holds, forked and fetched each RRef.

torch keeps only counters per process (``torch_compat.rref_debug_info``). nbrpc keeps
a ledger in every member, fed by four hooks (put in place by ``torch_compat.install``
through ``hook``):

- ``rpc.remote`` and ``PyRRef.__init__`` (``RRef(value)``): a create event, the call site.
- the pickler's RRef reducer (``RpcPickler`` asks ``reducer_table``): the sender pickles
  with torch's own fork data (the real fork) and the receiver records a fork event
  from it, whose ``parent`` is the sending worker.
- ``PyRRef.to_here``: a fetch event (the value's summary is asked of its owner when a
  report wants it, as for any value: summarizing each fetched value took every
  ``to_here`` a repr of it).
- a weak reference to every RRef object: when the last one of an id in this process
  is garbage-collected, a delete event (torch tells the owner, who drops the value
  once no user reference is left).

The ledger holds ids, never values, and forgets an RRef when its last user reference
here dies; events go to a bounded ring. ``report`` is this member's ledger as plain
data, with each value's type and summary asked of its owner once and cached;
``rrefs`` gathers every member's report into the cluster's snapshot.
"""

from __future__ import annotations

import collections
import linecache
import os
import re
import reprlib
import socket
import sys
import threading
import time
import weakref

import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from .._compat.torch_compat import PyRRef

__all__ = ["report", "summarize"]

EVENTS_KEPT = 5000
# An RRef's repr names its id: "...RRefId = GloballyUniqueId(created_on=0, local_id=5)...".
_CREATED_ON, _LOCAL_ID = "created_on=", ", local_id="
# Frames in these directories are library code, not the user's call site.
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")

_torch_init = torch_compat.rref_init


class _Held:
    """RRef objects of one id alive in this process, and what is known of their value."""

    __slots__ = ("owner", "refs", "type", "summary", "size", "call_site", "from_owner")

    def __init__(self, owner: int, type: str | None = None, call_site: tuple | None = None):
        self.owner, self.refs, self.type, self.call_site = owner, [], type, call_site
        self.summary = self.size = None
        # torch never marks a fork received from its owner confirmed, but the owner sent it.
        self.from_owner = False


class _Ref(weakref.ref):
    """A weak reference to one tracked RRef object, knowing its RRef id (the callback
    runs once the object is gone, when its repr can no longer be read)."""

    __slots__ = ("rref_id", "object_id")


class _Ledger:
    """This process's user references (by RRef id), its recent events, whether it
    tracks and its worker id; ``reset`` empties it for a new member or cluster.

    Every RRef's life passes through ``hold`` and ``_dropped``: both do as little as
    they can (no formatting, no summaries: ``report`` asks for those when it is asked)."""

    def __init__(self):
        self.tracking = False
        self.me = -1  # this member's worker id, set by reset()
        self.lock = threading.Lock()
        self.held: dict[str, _Held] = {}
        # id() of each tracked RRef object -> its RRef id: to_here finds it without
        # formatting the RRef's repr again.
        self.objects: dict[int, str] = {}
        self.events: collections.deque = collections.deque(maxlen=EVENTS_KEPT)
        self._on_drop = self._dropped  # one bound method for every weak reference

    def hold(self, rref, rref_id: str, owner: int, kind: str, source: int, target: int,
             type_name: str | None = None, call_site: tuple | None = None) -> _Held:
        """Start tracking one RRef object and log how it arrived."""
        ref = _Ref(rref, self._on_drop)
        ref.rref_id, ref.object_id = rref_id, id(rref)
        with self.lock:
            self.objects[id(rref)] = rref_id
            held = self.held.get(rref_id)
            if held is None:
                held = self.held[rref_id] = _Held(owner, type_name, call_site)
            held.refs.append(ref)
            self.events.append((time.time(), kind, rref_id, source, target))
        return held

    def log(self, kind: str, rref_id: str, source: int, target: int) -> None:
        self.events.append((time.time(), kind, rref_id, source, target))

    def _dropped(self, ref: _Ref) -> None:
        rref_id = ref.rref_id
        with self.lock:
            if self.objects.get(ref.object_id) == rref_id:
                del self.objects[ref.object_id]
            held = self.held.get(rref_id)
            try:
                held.refs.remove(ref)
            except (AttributeError, ValueError):
                return  # from before a reset
            if not held.refs:
                del self.held[rref_id]
                self.events.append((time.time(), "delete", rref_id, self.me, held.owner))

    def reset(self) -> None:
        with self.lock:
            self.held.clear()
            self.objects.clear()
            self.events.clear()


_ledger = _Ledger()
_quiet = threading.local()  # set while nbrpc itself sends RRefs (summaries)


def _my_id() -> int:
    return _ledger.me


def rref_id(rref) -> str:
    """``created_on:local_id`` of an RRef, read from its repr (never ``_serialize``,
    which would register a fork that no one ever deletes), by partitioning: a regex took
    0.6 us of every RRef's life."""
    return repr(rref).partition(_CREATED_ON)[2].partition(")")[0].replace(_LOCAL_ID, ":")


# -- hooks -----------------------------------------------------------------------


def hook(enabled: bool = True) -> None:
    """Track RRefs in this member (or not): ``RRef(value)``'s hook, and the calls layer's
    ``remote`` and ``to_here`` report to ``created`` and ``fetched`` while tracking."""
    torch_compat.patch(torch_compat.RREF_INIT, _init if enabled else _torch_init)
    _ledger.tracking = enabled


def reset() -> None:
    """An empty ledger for this member (once it has joined, or for a new cluster)."""
    _ledger.reset()
    _ledger.me = torch_compat.current_agent().get_worker_info().id


def is_tracking() -> bool:
    return _ledger.tracking


def created(rref) -> None:
    """``rpc.remote`` made ``rref`` here (while tracking)."""
    owner = rref.owner().id
    _ledger.hold(rref, rref_id(rref), owner, "create", _my_id(), owner, call_site=_call_site())


def _init(self, value, *args, **kwargs):
    """``RRef(value)``: a local value owned here."""
    _torch_init(self, value, *args, **kwargs)
    if _ledger.tracking:  # the value's summary is made when a report asks (its owner is here)
        me = _ledger.me
        _ledger.hold(self, rref_id(self), me, "create", me, me, call_site=_call_site())


def fetched(rref) -> None:
    """``rref.to_here()`` brought its value here from its owner (while tracking)."""
    rid = _ledger.objects.get(id(rref))
    held = _ledger.held.get(rid) if rid else None
    if held is None:  # not found by object (from before tracking started, say)
        rid = rref_id(rref)
        held = _ledger.held.get(rid)
    owner = held.owner if held else rref.owner().id
    if owner != _ledger.me:
        _ledger.log("fetch", rid, owner, _ledger.me)


def reduce(rref):
    """Pickle an RRef as torch does, for a receiver that records the fork."""
    return _receive, (torch_compat.fork_data(rref), getattr(_quiet, "on", False))


def _receive(fork_data, quiet: bool = False):
    rref = torch_compat.rref_from_fork_data(fork_data)
    if _ledger.tracking and not quiet:
        owner, created_on, local_id, _, _, parent, type_name = fork_data
        held = _ledger.hold(rref, f"{created_on}:{local_id}", owner, "fork", parent, _my_id(),
                            type_name=type_name.rsplit(".", 1)[-1])
        held.from_owner = held.from_owner or parent == owner
    return rref


def reducer_table() -> dict:
    """Reducers for the RPC pickler: nbrpc's while tracking, else none (torch's)."""
    return _REDUCERS if _ledger.tracking else {}


_REDUCERS = {PyRRef: reduce, rpc.RRef: reduce}


def _call_site() -> tuple | None:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame = frame.f_back
    if frame is None:
        return None
    return frame.f_code.co_filename, frame.f_lineno


def _describe_call_site(site: tuple | None) -> str | None:
    if site is None:
        return None
    filename, line = site
    where = "cell" if _CELL_FILE.search(filename) else os.path.basename(filename)
    text = linecache.getline(filename, line).strip()
    return f"{where} line {line}: {text}" if text else f"{where} line {line}"


def summarize(value) -> tuple[str, str, int | None]:
    """Type name, a one-line summary and the size in bytes (tensors, modules) of a value."""
    if isinstance(value, torch.Tensor):
        shape = ", ".join(str(d) for d in value.shape)
        dtype = str(value.dtype).removeprefix("torch.")
        return "Tensor", f"Tensor[{shape}] {dtype}", value.element_size() * value.nelement()
    type_name = type(value).__name__
    if isinstance(value, torch.nn.Module):
        params = list(value.parameters())
        count = sum(p.nelement() for p in params)
        return type_name, f"{type_name} ({count:,} parameters)", sum(
            p.element_size() * p.nelement() for p in params)
    text = _SHORT.repr(value)  # a few items of a container, not all of them
    if " at 0x" in text:  # the default repr: an address says nothing and changes
        text = f"{type_name} object"
    return type_name, text if len(text) <= 60 else text[:57] + "...", None


_SHORT = reprlib.Repr()
_SHORT.maxother = _SHORT.maxstring = _SHORT.maxlong = 60


# -- this member's report --------------------------------------------------------


def _summaries(rrefs: list) -> list[tuple]:
    """On the owner: summarize the values of RRefs it owns."""
    return [summarize(r.local_value()) for r in rrefs]


def _fill_summaries(timeout: float) -> None:
    """Ask owners (one call each) about values this process holds but never saw."""
    by_owner: dict[int, list] = collections.defaultdict(list)
    me = _my_id()
    with _ledger.lock:
        unknown = [h for h in _ledger.held.values() if h.summary is None]
    for held in unknown:
        rref = next((r for r in map(lambda w: w(), held.refs) if r is not None), None)
        if rref is None:
            continue
        if held.owner == me:
            held.type, held.summary, held.size = summarize(rref.local_value())
        else:
            by_owner[held.owner].append((held, rref))
    futures = []
    _quiet.on = True
    try:
        for owner, pairs in by_owner.items():
            fut = rpc.rpc_async(owner_name(owner), _summaries, args=([r for _, r in pairs],),
                                timeout=timeout)
            futures.append((fut, pairs))
    finally:
        _quiet.on = False
    for fut, pairs in futures:
        try:
            values = fut.wait()
        except (RuntimeError, TimeoutError):
            continue  # the owner is gone or busy; the summary stays unknown
        for (held, _), (type_name, summary, size) in zip(pairs, values):
            held.type, held.summary, held.size = type_name, summary, size


def owner_name(worker_id: int) -> str:
    return torch_compat.current_agent().get_worker_info(worker_id).name


def report(timeout: float = 5.0) -> dict:
    """This member's ledger as plain data (what ``rref_snapshot`` gathers)."""
    if _ledger.tracking:
        _fill_summaries(timeout)
    with _ledger.lock:
        held = list(_ledger.held.items())
        events = list(_ledger.events)
    rows = []
    for rid, h in held:
        alive = [r for r in (w() for w in h.refs) if r is not None]
        if not alive:
            continue
        confirmed = h.from_owner or any(r.is_owner() or r.confirmed_by_owner() for r in alive)
        rows.append(dict(id=rid, owner=h.owner, type=h.type, summary=h.summary, size=h.size,
                         call_site=_describe_call_site(h.call_site), confirmed=confirmed))
    info = torch_compat.current_agent().get_worker_info()
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                tracking=_ledger.tracking, held=rows, events=events,
                owned=int(torch_compat.rref_debug_info()["num_owner_rrefs"]))
