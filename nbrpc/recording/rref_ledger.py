"""RRef tracking in one member: who created, owns, holds, forked and fetched each RRef.

torch keeps only counters per process (``torch_compat.rref_debug_info``). nbrpc keeps
a ledger in every member, fed by four hooks (put in place by ``torch_compat.install``
through ``hook``):

- ``rpc.remote`` and ``PyRRef.__init__`` (``RRef(value)``): a create event, the call site
  (the RRef is entered later, or never if it dies first: see ``_Ledger.made``).
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
from . import pending

__all__ = ["report", "summarize"]

EVENTS_KEPT = 5000
# An RRef's repr names its id: "...RRefId = GloballyUniqueId(created_on=0, local_id=5)...".
_CREATED_ON, _LOCAL_ID = "created_on=", ", local_id="
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")

_torch_init = torch_compat.rref_init


class _Ref(weakref.ref):
    """A weak reference to one tracked RRef object, with what is known of it when it
    arrives (its callback runs once the object is gone, when its repr can no longer be
    read). What holds for the RRef id (its value's type and summary) is in
    ``_Ledger.known``, filled when a report asks."""

    __slots__ = ("object_id", "rref_id", "owner", "call_site", "type", "from_owner")


class _Ledger:
    """This process's tracked RRef objects, how many of each RRef id are alive, what is
    known of each id's value, its recent events, whether it tracks and its worker id;
    ``reset`` empties it for a new member or cluster.

    Every RRef's life passes through ``hold`` (or ``made``) and ``_dropped``: they do as
    little as they can (no formatting, no grouping, no summaries: ``report`` does those
    when it is asked)."""

    def __init__(self):
        self.tracking = False
        self.me = -1  # this member's worker id, set by reset()
        self.lock = threading.Lock()
        # id() of each tracked RRef object -> its reference: to_here finds its RRef id
        # without formatting the RRef's repr again.
        self.refs: dict[int, _Ref] = {}
        self.alive: dict[str, int] = {}  # RRef id -> tracked objects of it alive here
        self.known: dict[str, tuple] = {}  # RRef id -> its value's (type, summary, size)
        self.events: collections.deque = collections.deque(maxlen=EVENTS_KEPT)
        # A weak reference to each RRef object made here and not entered yet -> what
        # ``made`` took: its repr, destination, call site and time.
        self.fresh: dict[weakref.ref, tuple] = {}
        self._on_drop = self._dropped  # one bound method for every weak reference
        self.on_fresh_drop = self._fresh_dropped

    def hold(self, rref, rref_id: str, owner: int, type_name: str, source: int) -> None:
        """Start tracking a fork of an RRef that arrived here from ``source``."""
        ref = _Ref(rref, self._on_drop)
        ref.object_id, ref.rref_id, ref.owner = id(rref), rref_id, owner
        ref.call_site, ref.type = None, type_name
        # torch never marks a fork received from its owner confirmed, but the owner sent it.
        ref.from_owner = source == owner
        self.enter_made()  # an object of this id made here counts too
        with self.lock:
            self._count_in(ref)
        self.events.append((time.time(), "fork", rref_id, source, self.me))

    def made(self, rref, to, call_site: tuple | None) -> None:
        """``rpc.remote`` (to ``to``) or ``RRef(value)`` (``to`` is this member's id) made
        ``rref``, from ``call_site`` (``pending.site_line`` reads it): only what needs the
        object now is taken (its repr, which holds its id). It is entered when a report or
        a fork arriving asks (``enter_made``); one dropped before leaves its create and
        delete events only (and its fetches'). What runs between a ``remote`` and the
        ``to_here`` after it delays the fetch's request (see ``Pending.remote_sending``):
        entering it there took 8-10 us of that gap. An ``RRef(value)``'s tracked life took
        3.96 us over torch's when each was entered as it was made, 2.1-2.3 with an object
        per RRef keyed by its id() and its call site's line read at once, 1.8 like this
        (``_init``)."""
        self.fresh[weakref.ref(rref, self.on_fresh_drop)] = (repr(rref), to, call_site, time.time())

    def _fresh_dropped(self, ref: weakref.ref) -> None:
        made = self.fresh.pop(ref, None)
        if made is not None:  # made and dropped before anything entered it
            self.events.append((made, time.time()))  # a whole life: see ``read_events``

    def enter_made(self) -> None:
        """Enter every RRef ``made`` left for later."""
        while self.fresh:
            with self.lock:
                try:
                    weak, made = self.fresh.popitem()
                except KeyError:  # another thread took the last one
                    return
                rref = weak()
                if rref is None:  # dying as it was taken (its drop finds nothing): its life
                    self.events.append((made, time.time()))
                else:
                    self._enter(rref, made)

    def _enter(self, rref, made: tuple) -> None:
        """(with the lock) Enter an RRef ``made`` took, taken out of ``fresh``."""
        text, to, site, when = made
        ref = _Ref(rref, self._on_drop)
        ref.object_id, ref.rref_id, ref.owner = id(rref), _id_in(text), _worker_id(to)
        ref.call_site, ref.type, ref.from_owner = pending.site_line(site), None, False
        self._count_in(ref)
        self.events.append((when, "create", ref.rref_id, self.me, ref.owner))

    def _count_in(self, ref: _Ref) -> None:
        """(with the lock) One more tracked object of its RRef id."""
        self.refs[ref.object_id] = ref
        self.alive[ref.rref_id] = self.alive.get(ref.rref_id, 0) + 1

    def log(self, kind: str, rref_id: str, source: int, target: int) -> None:
        self.events.append((time.time(), kind, rref_id, source, target))

    def _dropped(self, ref: _Ref) -> None:
        with self.lock:
            if self.refs.get(ref.object_id) is not ref:
                return  # from before a reset
            rref_id = ref.rref_id
            del self.refs[ref.object_id]
            left = self.alive[rref_id] - 1
            if left:
                self.alive[rref_id] = left
                return
            del self.alive[rref_id]
            self.known.pop(rref_id, None)
        self.events.append((time.time(), "delete", rref_id, self.me, ref.owner))

    def read_events(self) -> list[tuple]:
        """The events as ``(time, kind, RRef id, source, target)``. An RRef made here and
        dropped before anything entered it left one record of its life (what ``made`` took,
        and when it died): its create and delete events, read here; so is a fetch of one not
        entered yet (what ``made`` took, "fetch", when)."""
        events = []
        for event in list(self.events):
            if len(event) == 2:
                (text, to, _, when), died = event
                rid, owner = _id_in(text), _worker_id(to)
                events += [(when, "create", rid, self.me, owner), (died, "delete", rid, self.me, owner)]
            elif len(event) == 3:
                (text, to, _, _), kind, when = event
                owner = _worker_id(to)
                if owner != self.me:
                    events.append((when, kind, _id_in(text), owner, self.me))
            else:
                events.append(event)
        return events

    def reset(self) -> None:
        with self.lock:
            self.refs.clear()
            self.alive.clear()
            self.known.clear()
            self.events.clear()
            self.fresh.clear()  # never entered: a drop finds them from before the reset


_ledger = _Ledger()
_quiet = threading.local()  # set while nbrpc itself sends RRefs (summaries)


def _my_id() -> int:
    return _ledger.me


def rref_id(rref) -> str:
    """``created_on:local_id`` of an RRef, read from its repr (never ``_serialize``,
    which would register a fork that no one ever deletes)."""
    return _id_in(repr(rref))


def _id_in(text: str) -> str:
    """The RRef id in an RRef's repr, by partitioning: a regex took 0.6 us of every RRef's life."""
    return text.partition(_CREATED_ON)[2].partition(")")[0].replace(_LOCAL_ID, ":")


def _worker_id(to) -> int:
    """The id of a call's destination (a name, a ``WorkerInfo`` or an id); -1 once the
    agent is gone."""
    if isinstance(to, int):
        return to
    if not isinstance(to, str):
        return to.id
    try:
        return torch_compat.current_agent().get_worker_info(to).id
    except RuntimeError:
        return -1


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


# ``rpc.remote`` made ``rref`` here, sent to ``to`` from ``call_site`` (while tracking):
# ``created(rref, to, call_site)``, the ledger's own ``made`` (no frame of its own: it runs
# between a ``remote`` and the fetch after it, see ``Pending.remote_sending``).
created = _ledger.made


def _init(self, value, type_hint=None):
    """``RRef(value)``: a local value owned here. ``made`` and ``pending.call_site`` in
    line, the site as code and instruction offset: the two calls took 0.25 us of the
    1.8 us that tracking adds to the life of an ``RRef(value)``."""
    _torch_init(self, value, type_hint)
    if _ledger.tracking:  # the value's summary is made when a report asks (its owner is here)
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename.startswith(pending.OWN_FOLDERS):
            frame = frame.f_back
        site = None if frame is None else (frame.f_code, frame.f_lasti)
        _ledger.fresh[weakref.ref(self, _ledger.on_fresh_drop)] = (repr(self), _ledger.me, site, time.time())


def fetched(rref) -> None:
    """``rref.to_here()`` brought its value here from its owner (while tracking). An RRef
    not entered yet (a ``remote``'s, fetched at once) stays so: the fetch is one record
    beside what ``made`` took, read as its event with the rest (``read_events``).
    Entering it here made tracking's share of a ``remote`` + ``to_here`` 24 us, not 6."""
    made = _ledger.fresh.get(weakref.ref(rref))
    if made is not None:
        _ledger.events.append((made, "fetch", time.time()))
        return
    _ledger.enter_made()
    ref = _ledger.refs.get(id(rref))
    if ref is not None and ref() is rref:
        rid, owner = ref.rref_id, ref.owner
    else:  # not tracked (made before tracking started, say)
        rid, owner = rref_id(rref), rref.owner().id
    if owner != _ledger.me:
        _ledger.log("fetch", rid, owner, _ledger.me)


def reduce(rref):
    """Pickle an RRef as torch does, for a receiver that records the fork."""
    return _receive, (torch_compat.fork_data(rref), getattr(_quiet, "on", False))


def _receive(fork_data, quiet: bool = False):
    rref = torch_compat.rref_from_fork_data(fork_data)
    if _ledger.tracking and not quiet:
        owner, created_on, local_id, _, _, parent, type_name = fork_data
        _ledger.hold(rref, f"{created_on}:{local_id}", owner, type_name.rsplit(".", 1)[-1], parent)
    return rref


def reducer_table() -> dict:
    """Reducers for the RPC pickler: nbrpc's while tracking, else none (torch's)."""
    return _REDUCERS if _ledger.tracking else {}


_REDUCERS = {PyRRef: reduce, rpc.RRef: reduce}


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


def _alive() -> dict[str, list[tuple]]:
    """Per RRef id, ``(reference, object)`` of each tracked object of it still alive here."""
    _ledger.enter_made()
    with _ledger.lock:
        refs = list(_ledger.refs.values())
    by_id: dict[str, list[tuple]] = {}
    for ref in refs:
        rref = ref()
        if rref is not None:
            by_id.setdefault(ref.rref_id, []).append((ref, rref))
    return by_id


def _learn(rref_id: str, found: tuple) -> None:
    """Keep what an owner said of a value while the RRef id is held here."""
    with _ledger.lock:
        if rref_id in _ledger.alive:
            _ledger.known[rref_id] = found


def _fill_summaries(by_id: dict[str, list[tuple]], timeout: float) -> None:
    """Ask owners (one call each) about values this process holds but never saw."""
    by_owner: dict[int, list] = collections.defaultdict(list)
    me = _my_id()
    for rid, [(ref, rref), *_] in by_id.items():
        if rid in _ledger.known:
            continue
        if ref.owner == me:
            _learn(rid, summarize(rref.local_value()))
        else:
            by_owner[ref.owner].append((rid, rref))
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
        for (rid, _), found in zip(pairs, values):
            _learn(rid, tuple(found))


def owner_name(worker_id: int) -> str:
    return torch_compat.current_agent().get_worker_info(worker_id).name


def report(timeout: float = 5.0) -> dict:
    """This member's ledger as plain data (what ``rref_snapshot`` gathers)."""
    by_id = _alive()
    if _ledger.tracking:
        _fill_summaries(by_id, timeout)
    events = _ledger.read_events()
    rows = []
    for rid, pairs in by_id.items():
        refs = [ref for ref, _ in pairs]
        arrived_as = next((r.type for r in refs if r.type), None)  # the type a fork named
        type_name, summary, size = _ledger.known.get(rid) or (arrived_as, None, None)
        call_site = next((r.call_site for r in refs if r.call_site), None)
        confirmed = any(ref.from_owner or rref.is_owner() or rref.confirmed_by_owner()
                        for ref, rref in pairs)
        rows.append(dict(id=rid, owner=refs[0].owner, type=type_name, summary=summary, size=size,
                         call_site=_describe_call_site(call_site), confirmed=confirmed))
    info = torch_compat.current_agent().get_worker_info()
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                tracking=_ledger.tracking, held=rows, events=events,
                owned=int(torch_compat.rref_debug_info()["num_owner_rrefs"]))
