"""RRef tracking: who created, owns, holds, forked and fetched each RRef.

torch keeps only counters per process (``_rref_context_get_debug_info``). nbrpc keeps a
ledger in every member, fed by four hooks installed when the member joins:

- ``rpc.remote`` and ``PyRRef.__init__`` (``RRef(value)``): a create event, the call site.
- the pickler's RRef reducer (``RpcPickler`` asks ``reducer_table``): the sender pickles
  with torch's own ``_serialize`` (the real fork) and the receiver records a fork event
  from the fork data, whose ``parent`` is the sending worker.
- ``PyRRef.to_here``: a fetch event (and a free summary of the value).
- a weak reference to every RRef object: when the last one of an id in this process
  is garbage-collected, a delete event (torch tells the owner, who drops the value
  once no user reference is left).

The ledger holds ids, never values, and forgets an RRef when its last user reference
here dies; events go to a bounded ring. ``rref_snapshot`` asks every member for its
ledger (in parallel, one call each) and merges them into an ``RRefSnapshot``. A
value's type and summary come from its owner, asked once per RRef and cached.
"""

from __future__ import annotations

import collections
import functools
import linecache
import os
import re
import socket
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed.rpc as rpc
from torch._C._distributed_rpc import PyRRef
from torch.distributed.rpc import api
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT

from . import calls
from .schemas import RRefSnapshot

__all__ = ["rref_snapshot", "summarize"]

EVENTS_KEPT = 5000
_ID = re.compile(r"created_on=(\d+), local_id=(\d+)")
# Frames in these directories are library code, not the user's call site.
_LIBRARY_DIRS = (os.path.dirname(torch.__file__), os.path.dirname(__file__))
_CELL_FILE = re.compile(r"ipykernel_\d+[/\\]\d+\.py$")

_torch_remote = calls.remote  # torch's, naming its failures
_torch_init = PyRRef.__init__
_torch_to_here = calls.to_here  # torch's, named and interruptible


@dataclass
class _Held:
    """RRef objects of one id alive in this process, and what is known of their value."""

    owner: int
    refs: list = field(default_factory=list)
    type: str | None = None
    summary: str | None = None
    size: int | None = None
    call_site: tuple | None = None
    # torch never marks a fork received from its owner confirmed, but the owner sent it.
    from_owner: bool = False


class _Ledger:
    """This process's user references (by RRef id) and its recent events."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held: dict[str, _Held] = {}
        # id() of each tracked RRef object -> its RRef id: to_here finds it without
        # formatting the RRef's repr again.
        self.objects: dict[int, str] = {}
        self.events: collections.deque = collections.deque(maxlen=EVENTS_KEPT)

    def hold(self, rref, rref_id: str, owner: int, kind: str, source: int, target: int,
             type_name: str | None = None, call_site: tuple | None = None) -> _Held:
        """Start tracking one RRef object and log how it arrived."""
        ref = weakref.ref(rref, functools.partial(self._dropped, rref_id, id(rref)))
        with self.lock:
            self.objects[id(rref)] = rref_id
            held = self.held.get(rref_id)
            if held is None:
                held = self.held[rref_id] = _Held(owner, type=type_name, call_site=call_site)
            held.refs.append(ref)
            self.events.append((time.time(), kind, rref_id, source, target))
        return held

    def log(self, kind: str, rref_id: str, source: int, target: int) -> None:
        self.events.append((time.time(), kind, rref_id, source, target))

    def _dropped(self, rref_id: str, object_id: int, ref) -> None:
        with self.lock:
            if self.objects.get(object_id) == rref_id:
                del self.objects[object_id]
            held = self.held.get(rref_id)
            if held is None or ref not in held.refs:
                return  # from before a reset
            held.refs.remove(ref)
            if not held.refs:
                del self.held[rref_id]
                self.events.append((time.time(), "delete", rref_id, _my_id(), held.owner))

    def reset(self) -> None:
        with self.lock:
            self.held.clear()
            self.objects.clear()
            self.events.clear()


_ledger = _Ledger()
_tracking = False
_quiet = threading.local()  # set while nbrpc itself sends RRefs (summaries)
_me = -1  # this member's worker id, set by install()


def _my_id() -> int:
    return _me


def rref_id(rref) -> str:
    """``created_on:local_id`` of an RRef, read from its repr (never ``_serialize``,
    which would register a fork that no one ever deletes)."""
    found = _ID.search(repr(rref))
    return f"{found[1]}:{found[2]}"


# -- hooks -----------------------------------------------------------------------


def install(enabled: bool = True) -> None:
    """Turn tracking on (or off) in this member, with an empty ledger (after joining)."""
    global _tracking, _me
    _me = api._get_current_rpc_agent().get_worker_info().id
    _ledger.reset()
    if enabled:
        api.remote = rpc.remote = remote
        PyRRef.__init__ = _init
        PyRRef.to_here = _to_here
    else:
        api.remote = rpc.remote = _torch_remote
        PyRRef.__init__ = _torch_init
        PyRRef.to_here = _torch_to_here
    _tracking = enabled


def install_remote() -> None:
    """Put nbrpc's ``rpc.remote`` in place before the agent starts (it records only
    while tracking is on), so that the RRef helper ``rref.remote()`` goes through it."""
    api.remote = rpc.remote = remote


def is_tracking() -> bool:
    return _tracking


@functools.wraps(_torch_remote)
def remote(to, func, args=None, kwargs=None, timeout=UNSET_RPC_TIMEOUT):
    rref = _torch_remote(to, func, args, kwargs, timeout)
    if _tracking:
        owner = rref.owner().id
        _ledger.hold(rref, rref_id(rref), owner, "create", _my_id(), owner,
                     call_site=_call_site())
    return rref


def _init(self, value, *args, **kwargs):
    """``RRef(value)``: a local value owned here."""
    _torch_init(self, value, *args, **kwargs)
    if _tracking:
        me = _my_id()
        held = _ledger.hold(self, rref_id(self), me, "create", me, me, call_site=_call_site())
        held.type, held.summary, held.size = summarize(value)


def _to_here(self, timeout=UNSET_RPC_TIMEOUT):
    value = _torch_to_here(self, timeout)
    if _tracking:
        rid = _ledger.objects.get(id(self))
        held = _ledger.held.get(rid) if rid else None
        if held is None:  # not found by object (from before tracking started, say)
            rid = rref_id(self)
            held = _ledger.held.get(rid)
        owner = held.owner if held else self.owner().id
        if owner != _me:
            _ledger.log("fetch", rid, owner, _me)
            if held is not None and held.summary is None:
                held.type, held.summary, held.size = summarize(value)
    return value


def reduce(rref):
    """Pickle an RRef as torch does, for a receiver that records the fork."""
    return _receive, (rref._serialize(), getattr(_quiet, "on", False))


def _receive(fork_data, quiet: bool = False):
    rref = PyRRef._deserialize(fork_data)
    if _tracking and not quiet:
        owner, created_on, local_id, _, _, parent, type_name = fork_data
        held = _ledger.hold(rref, f"{created_on}:{local_id}", owner, "fork", parent, _my_id(),
                            type_name=type_name.rsplit(".", 1)[-1])
        held.from_owner = held.from_owner or parent == owner
    return rref


def reducer_table() -> dict:
    """Reducers for the RPC pickler: nbrpc's while tracking, else none (torch's)."""
    return _REDUCERS if _tracking else {}


_REDUCERS = {PyRRef: reduce, rpc.RRef: reduce}


def _call_site() -> tuple | None:
    frame = sys._getframe(2)
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
    text = repr(value)
    if " at 0x" in text:  # the default repr: an address says nothing and changes
        text = f"{type_name} object"
    return type_name, text if len(text) <= 60 else text[:57] + "...", None


# -- snapshot --------------------------------------------------------------------


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
    return api._get_current_rpc_agent().get_worker_info(worker_id).name


def report(timeout: float = 5.0) -> dict:
    """This member's ledger as plain data (what ``rref_snapshot`` gathers)."""
    if _tracking:
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
    info = api._get_current_rpc_agent().get_worker_info()
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                tracking=_tracking, held=rows, events=events,
                owned=int(rpc._rref_context_get_debug_info()["num_owner_rrefs"]))


def gather(timeout: float = 5.0) -> list[dict]:
    """Every member's ``report``, asked in parallel; unreachable members are left out."""
    return sorted(calls.ask_members(report, (timeout,), timeout), key=lambda r: r["id"])


def rref_snapshot(timeout: float = 5.0) -> RRefSnapshot:
    """Every RRef alive in the group: owner, creator, holders, value summary, and events
    (``nbrpc.schemas.RRefSnapshot``)."""
    reports = gather(timeout)
    if not any(r["tracking"] for r in reports):
        raise RuntimeError(
            "RRef tracking is off in this cluster (it was started with track=False); "
            "start it with tracking on (the default) to take RRef snapshots"
        )
    return merge(reports)


def merge(reports: list[dict]) -> RRefSnapshot:
    """Combine members' ledgers into one snapshot (pure: unit-testable)."""
    names = {r["id"]: r["name"] for r in reports}

    def name(worker_id: int) -> str:
        return names.get(worker_id, f"#{worker_id}")

    rrefs: dict[str, dict] = {}
    for r in reports:
        for row in r["held"]:
            entry = rrefs.setdefault(row["id"], dict(
                id=row["id"], owner=name(row["owner"]),
                creator=name(int(row["id"].split(":")[0])), holders=[], type=None,
                summary=None, size=None, call_site=None, confirmed=False))
            entry["holders"].append(r["name"])
            for key in ("type", "summary", "size", "call_site"):
                if entry[key] is None:
                    entry[key] = row[key]
            entry["confirmed"] = entry["confirmed"] or row["confirmed"]
    events = sorted(e for r in reports for e in r["events"])[-EVENTS_KEPT:]
    return dict(
        workers=[dict(name=r["name"], id=r["id"], host=r["host"], pid=r["pid"]) for r in reports],
        rrefs=sorted(rrefs.values(), key=_id_order),
        events=[{"t": round(t, 6), "kind": kind, "rref": rid, "from": name(a), "to": name(b)}
                for t, kind, rid, a, b in events],
    )


def _id_order(entry: dict) -> tuple[int, int]:
    created_on, local_id = entry["id"].split(":")
    return int(created_on), int(local_id)
