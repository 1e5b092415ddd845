"""Record every RPC on every member, and join the records into one timeline.

Each RPC leaves two halves, each written by the member that saw it into its own
bounded ring (``Ring``; the oldest halves go first, and are counted):

- the caller's (``outgoing``, then ``answered``): callee, what ran, when it was sent
  and when the reply arrived, request bytes, the call it was made in (``parent``),
  the autograd context, the RRef, the error. ``calls`` writes it for ``rpc_sync``,
  ``rpc_async``, ``remote`` and ``to_here`` (and so for RRef helpers and
  ``DistributedOptimizer.step``, which go through them).
- the callee's (``started``, ``finished``): when a thread began and ended the
  function, which thread, the reply's bytes, the error. ``interrupts.Stoppable``,
  which already wraps every Python function a caller sends, carries the caller's
  call id and writes it.

Bytes are counted by the pickler (``count``, ``received``): tensor bytes (torch's
tensor table) apart from the pickle around them. A backward pass's gradients
travel in C++ messages no Python sees; hooks on the ``RecvRpcBackward`` (the
sender, in the backward direction) and ``SendRpcBackward`` (the receiver)
functions of a context, paired by autograd message id, stand for them.

``gather`` asks every member for its halves in parallel; ``merge`` (pure) joins them
by call id into ``CallRecord`` s on the driver's clock (see ``clocks``);
``chrome_trace`` and ``summarize`` (pure) turn a snapshot into Chrome's trace event
format and a table. ``trace()`` records a block, ``trace_snapshot`` reads a cluster
started with ``trace=True``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import os
import socket
import statistics
import threading
from pathlib import Path

import torch

from . import clocks, torch_compat
from .schemas import CallRecord, TraceSnapshot

__all__ = ["Trace", "trace", "trace_snapshot"]

CAPACITY = 20_000  # halves kept per member
CONTEXTS_KEPT = 64  # autograd contexts whose hooks are remembered per member
# torch's names for the messages that carry what no Python function runs.
GRADIENTS = "BACKWARD_AUTOGRAD_REQ"
FETCH = "RREF_FETCH_CALL"

# Read on every call: plain module globals.
recording = False  # this member writes caller halves
armed = False  # some half may wait for the pickler to count its bytes here
_always = False  # the cluster was started with trace=True
_blocks = 0  # open ``trace()`` blocks that turned recording on here
_me = "?"
_ids = itertools.count()
# Per-thread state, by thread ident. Not threading.local: a torch RPC thread may take
# the GIL with a fresh thread state for each step of a call (its thread-locals start
# empty) until nbrpc keeps its state (``torch_compat.keep_thread_state``).
_quiet: set[int] = set()  # threads whose calls are nbrpc's own
_running: dict[int, str] = {}  # the recorded call a thread runs (its calls' parent)
_sending: dict[int, dict] = {}  # the caller half whose request a thread pickles next
_fetching: dict[int, dict] = {}  # the caller half whose reply a thread unpickles next
_replies: dict[int, dict] = {}  # the callee half whose result a thread pickles next


class Ring:
    """The last ``capacity`` halves of this member, and how many were evicted when:
    ``evicted`` holds ``[time, count]`` per ``BUCKET`` seconds (bounded too)."""

    BUCKET = 0.01

    def __init__(self, capacity: int = CAPACITY):
        self.halves: collections.deque = collections.deque(maxlen=capacity)
        self.evicted: collections.deque = collections.deque(maxlen=capacity)

    def add(self, half: dict) -> None:
        halves = self.halves
        if len(halves) == halves.maxlen:
            t = halves[0]["t"]
            evicted = self.evicted
            if evicted and t - evicted[-1][0] < self.BUCKET:
                evicted[-1][1] += 1
            else:
                evicted.append([t, 1])
        halves.append(half)

    def since(self, start: float | None) -> list[dict]:
        return [dict(h) for h in list(self.halves) if start is None or h["t"] >= start]

    def dropped(self, start: float, end: float) -> int:
        return sum(n for t, n in list(self.evicted) if start <= t <= end)


_ring = Ring()


# -- turning it on -----------------------------------------------------------------


def install(always: bool = False) -> None:
    """Record in this member from now on if ``always`` (a cluster started with
    ``trace=True``), else only inside ``trace()`` blocks; after joining."""
    global _always, _me
    _me = torch_compat.current_agent().get_worker_info().name
    clocks.set_skew()
    _always = bool(always)
    _update()


def enable(on: bool = True) -> dict:
    """One ``trace()`` block begins (or ends) here; returns this member's identity."""
    global _blocks
    _blocks = max(0, _blocks + (1 if on else -1))
    _update()
    return identity()


def _update() -> None:
    global recording, armed
    recording = _always or _blocks > 0
    if recording:
        armed = True


def set_capacity(capacity: int) -> None:
    """Keep ``capacity`` halves in this member (emptying its ring)."""
    global _ring
    _ring = Ring(capacity)


def identity() -> dict:
    return dict(name=_me, pid=os.getpid(), clock=clocks.clock_id())


@contextlib.contextmanager
def quiet():
    """Calls this thread makes inside the block are not recorded (nbrpc's own)."""
    me = threading.get_ident()
    before = me in _quiet
    _quiet.add(me)
    try:
        yield
    finally:
        if not before:
            _quiet.discard(me)


# -- the caller's half --------------------------------------------------------------


def outgoing(kind: str, to, func=None, args=None, rref=None) -> dict | None:
    """Start the caller's half of a call about to be sent (None: not recorded)."""
    me = threading.get_ident()
    if me in _quiet:
        return None
    name, rref_arg, what, torch_pickles = _describe(func, args)
    if what is not None:
        kind = what
    context = None
    if what == "internal" and name.rsplit(".", 1)[-1] in torch_compat.OPTIMIZER_STEPS:
        kind, context = "optimizer", args[1]  # DistributedOptimizer.step's, on one owner
    if rref is not None:
        rref_arg = rref
        name = FETCH
    request = [0, 0]
    if torch_pickles:
        # torch pickles a builtin's or TorchScript function's arguments itself: count
        # the tensors among them, and look for the context as ``count`` would.
        tensors = [a for a in args or () if isinstance(a, torch.Tensor)]
        request[0] = _size(tensors)
        if context is None and any(a.requires_grad for a in tensors):
            context = _context()
    t = clocks.now()
    half = dict(
        side="caller", key=f"{_me}:{next(_ids)}", t=t, caller=_me, callee=_name(to),
        kind=kind, name=name, sent=t, replied=None, request=request, reply=None,
        parent=_running.get(me), context=context,
        rref=_rref_id(rref_arg) if rref_arg is not None else None, error=None,
    )
    _ring.add(half)
    return half


def sending(half: dict | None) -> None:
    """The next pickle this thread writes is ``half``'s request (None: no longer)."""
    _set(_sending, half)


def fetching(half: dict | None) -> None:
    """The next pickle this thread reads is ``half``'s reply (to_here)."""
    _set(_fetching, half)


def _set(state: dict, value) -> None:
    if value is None:
        state.pop(threading.get_ident(), None)
    else:
        state[threading.get_ident()] = value


def answered(half: dict, error: BaseException | None = None) -> None:
    half["replied"] = clocks.now()
    if error is not None:
        half["error"] = _error_text(error)


def answered_future(half: dict, fut) -> None:
    """Done-callback form of ``answered`` for torch futures."""
    try:
        fut.wait()
    except Exception as e:
        answered(half, e)
    else:
        answered(half)


def failed(half: dict, error: BaseException) -> None:
    """The call failed before any reply (not sent, or its wait ended in an error)."""
    half["error"] = half["error"] or _error_text(error)


def _describe(func, args) -> tuple[str, object, str | None, bool]:
    """Name of ``func``, an RRef among ``args``, the kind it makes a call, if special,
    and whether torch pickles the arguments itself (a builtin, a TorchScript function)."""
    if func is None:
        return "", None, None, False
    rref = None
    for a in args or ():
        if isinstance(a, torch_compat.PyRRef):
            rref = a
            break
    builtin = torch_compat.find_builtin(func)
    if builtin is not None:
        return builtin, rref, None, True
    if func in _HELPERS and args:
        return _helper_name(args[0], args[1]), args[0], "rref_helper", False
    if isinstance(func, torch.jit.ScriptFunction):  # "__torch__.module.name"
        name = func.qualified_name
        return name.removeprefix("__torch__."), rref, _internal(name), True
    name = getattr(func, "__qualname__", None) or repr(func)
    return name, rref, _internal(getattr(func, "__module__", None) or ""), False


def _internal(module: str) -> str | None:
    """torch's own functions (``_rref_typeof_on_owner``...) make internal calls."""
    return "internal" if module.removeprefix("__torch__.").startswith("torch.distributed") else None


def _helper_name(rref, method: str) -> str:
    try:
        return f"{torch_compat.rref_type(rref).__qualname__}.{method}"
    except Exception:
        return f"RRef.{method}"


def _name(to) -> str:
    if isinstance(to, str):
        return to
    if hasattr(to, "name"):
        return to.name
    try:
        return torch_compat.current_agent().get_worker_info(to).name
    except Exception:
        return str(to)


def _context() -> int | None:
    try:
        return torch_compat.current_context_id()
    except RuntimeError:
        return None


def _rref_id(rref) -> str | None:
    from .rref_ledger import rref_id

    try:
        return rref_id(rref)
    except Exception:
        return None


def _error_text(error: BaseException) -> str:
    text = str(error).split("\n\nAt:", 1)[0].strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


# -- the callee's half --------------------------------------------------------------


def started(trace: tuple, func, args) -> dict:
    """A thread of this member begins running a recorded call (``Stoppable``)."""
    global armed
    armed = True
    key = trace[0]
    me = threading.get_ident()
    t = clocks.now()
    half = dict(side="callee", key=key, member=_me, t=t, began=t, ended=None,
                thread=_thread(), reply=None, error=None, outer=_running.get(me))
    if func in _HELPERS and args:
        half["name"] = _callee_helper_name(args[0], args[1])
    _running[me] = key
    _replies.pop(me, None)
    _ring.add(half)
    return half


def finished(half: dict, trace: tuple, error: BaseException | None) -> None:
    half["ended"] = clocks.now()
    if error is not None:
        half["error"] = _error_text(error)
    me = threading.get_ident()
    outer = half.pop("outer", None)
    if outer is None:
        _running.pop(me, None)
    else:
        _running[me] = outer
    if trace[1]:  # its result is pickled next, on this thread, as the reply
        _replies[me] = half


def _callee_helper_name(rref, method: str) -> str:
    try:
        return f"{type(rref.local_value()).__qualname__}.{method}"
    except Exception:
        return f"RRef.{method}"


def _thread() -> str:
    current = threading.current_thread()
    if isinstance(current, threading._DummyThread):  # one of torch's RPC threads
        return f"rpc-thread-{threading.get_native_id()}"
    return current.name


# -- bytes, counted by the pickler ---------------------------------------------------


def count(obj, pickled: int) -> None:
    """The RPC pickler wrote ``obj`` in ``pickled`` bytes on this thread."""
    half = _sending.pop(threading.get_ident(), None) if _sending else None
    if half is not None:
        tensors = getattr(torch_compat.tensor_tables, "send_tables", None) or ()
        half["request"] = [_size(tensors), pickled]
        # As torch does: a message joins the autograd context only with a tensor that
        # requires grad (and finding the context costs an exception when there is none).
        if half["context"] is None and any(t.requires_grad for t in tensors):
            half["context"] = _context()
        return
    half = _replies.pop(threading.get_ident(), None) if _replies else None
    if half is not None:
        half["reply"] = [_tensor_bytes("send_tables"), pickled]


def received(pickled: int) -> None:
    """The RPC unpickler read ``pickled`` bytes on this thread."""
    half = _fetching.pop(threading.get_ident(), None) if _fetching else None
    if half is not None:
        half["reply"] = [_tensor_bytes("recv_tables"), pickled]


def _tensor_bytes(table: str) -> int:
    return _size(getattr(torch_compat.tensor_tables, table, None) or ())


def _size(tensors) -> int:
    return sum(t.element_size() * t.nelement() for t in tensors)


# -- distributed autograd ------------------------------------------------------------

_hooked: collections.OrderedDict[int, set] = collections.OrderedDict()
_passes: dict[tuple, int] = {}  # (context, message id, side) -> how many times it fired
_open: dict[tuple, dict] = {}  # callee halves between their pre- and post-hook


def before_backward(context_id: int) -> None:
    """Hook every member's send and recv functions of the context (before a backward)."""
    if not recording:
        return
    from . import calls

    with quiet():
        calls.ask_members(hook_context, (context_id,))


def hook_context(context_id: int) -> int:
    """Hook this member's send/recv functions of a context; returns how many are new."""
    try:
        ctx = torch_compat.retrieve_context(context_id)
    except RuntimeError:
        return 0
    hooked = _hooked.setdefault(context_id, set())
    while len(_hooked) > CONTEXTS_KEPT:
        old, _ = _hooked.popitem(last=False)
        for key in [k for k in _passes if k[0] == old]:
            del _passes[key]
    new = 0
    for message_id, fn in torch_compat.recv_functions(ctx).items():
        if ("recv", message_id) not in hooked:
            hooked.add(("recv", message_id))
            fn.register_prehook(functools.partial(_gradients_sent, context_id, message_id))
            new += 1
    for message_id, fn in torch_compat.send_functions(ctx).items():
        if ("send", message_id) not in hooked:
            hooked.add(("send", message_id))
            fn.register_prehook(functools.partial(_gradients_arrived, context_id, message_id))
            fn.register_hook(functools.partial(_gradients_passed, context_id, message_id))
            new += 1
    return new


def _pass(context_id: int, message_id: int, side: str) -> str:
    key = (context_id, message_id, side)
    _passes[key] = n = _passes.get(key, 0) + 1
    return f"ag:{context_id}:{message_id}:{n}"


def _gradients_sent(context_id: int, message_id: int, grads) -> None:
    """RecvRpcBackward is about to send gradients back to the member that sent its
    tensor forward (worker id: the message id's top 16 bits)."""
    t = clocks.now()
    nbytes = sum(g.element_size() * g.nelement() for g in grads if g is not None)
    _ring.add(dict(
        side="caller", key=_pass(context_id, message_id, "recv"), id=f"{_me}:{next(_ids)}", t=t,
        caller=_me, callee=_name(message_id >> 48), kind="autograd", name=GRADIENTS, sent=t,
        replied=None, request=[nbytes, 0], reply=None, parent=None, context=context_id,
        rref=None, error=None))


def _gradients_arrived(context_id: int, message_id: int, grads) -> None:
    t = clocks.now()
    key = _pass(context_id, message_id, "send")
    half = dict(side="callee", key=key, member=_me, t=t, began=t, ended=None,
                thread=_thread(), reply=None, error=None)
    _open[(context_id, message_id)] = half
    _ring.add(half)


def _gradients_passed(context_id: int, message_id: int, grad_inputs, grad_outputs) -> None:
    half = _open.pop((context_id, message_id), None)
    if half is not None:
        half["ended"] = clocks.now()


# -- gathering -----------------------------------------------------------------------


def report(since: float | None = None, offsets: dict | None = None) -> dict:
    """This member's halves from ``since`` (driver's clock) on, as plain data."""
    info = torch_compat.current_agent().get_worker_info()
    offset = (offsets or {}).get(info.name, 0.0)
    local_since = None if since is None else since - offset - 1.0
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                clock=clocks.clock_id(), recording=recording, halves=_ring.since(local_since),
                evicted=[(t, n) for t, n in list(_ring.evicted) if local_since is None or t >= local_since])


def gather(start: float | None, clocks_found: dict, timeout: float = 10.0) -> list[dict]:
    from . import calls

    offsets = {name: offset for name, (offset, _) in clocks_found.items()}
    with quiet():
        return calls.ask_members(report, (start, offsets), timeout)


def measure_clocks(timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """Each member's ``(offset, bound)`` from the driver's clock."""
    from . import calls

    with quiet():
        found = calls.ask_members(identity, (), timeout)
        return clocks.estimate_all({m["name"]: m["clock"] for m in found}, timeout)


def snapshot(start: float, end: float, clocks_found: dict | None = None,
             timeout: float = 10.0) -> TraceSnapshot:
    """Every member's calls sent in [start, end] (driver's clock), joined."""
    if clocks_found is None:
        clocks_found = measure_clocks(timeout)
    reports = gather(start, clocks_found, timeout)
    missing = {r["name"] for r in reports} - set(clocks_found)
    if missing:  # joined since the clocks were measured
        with quiet():
            clocks_found = {**clocks_found, **clocks.estimate_all(
                {r["name"]: r["clock"] for r in reports if r["name"] in missing}, timeout)}
    return merge(reports, clocks_found, start, end)


_CALLER_FIELDS = ("caller", "callee", "kind", "name", "sent", "replied", "request", "reply",
                  "parent", "context", "rref", "error")


def merge(reports: list[dict], clocks_found: dict, start: float, end: float) -> TraceSnapshot:
    """Join members' halves into call records on the driver's clock (pure)."""
    callers: dict[str, dict] = {}
    callees: dict[str, dict] = {}
    dropped = 0
    for r in sorted(reports, key=lambda r: r["id"]):
        offset = clocks_found.get(r["name"], (0.0, 0.0))[0]
        for half in r["halves"]:
            half = _shifted(half, offset)
            (callers if half["side"] == "caller" else callees)[half["key"]] = half
        dropped += sum(n for t, n in r["evicted"] if start <= t + offset <= end)
    calls: list[CallRecord] = []
    for key, c in callers.items():
        if not start <= c["sent"] <= end:
            continue
        e = callees.pop(key, None) or {}
        record = {"id": c.get("id", key), **{f: c[f] for f in _CALLER_FIELDS}}
        record["began"], record["ended"] = e.get("began"), e.get("ended")
        record["thread"] = e.get("thread")
        record["request"] = _bytes(c["request"])
        record["reply"] = _bytes(e.get("reply") or c["reply"])
        record["name"] = e.get("name") or c["name"]
        record["error"] = e.get("error") or c["error"]  # the callee's own exception first
        calls.append(record)
    # A callee half whose caller half is gone: lost to the caller's ring (or with it).
    dropped += sum(start <= e["began"] <= end for e in callees.values()
                   if e["key"] not in callers)
    names = {r["id"]: r["name"] for r in reports}
    order = {f: i for i, f in enumerate(_RECORD_FIELDS)}
    calls = [dict(sorted(c.items(), key=lambda kv: order[kv[0]])) for c in calls]
    calls.sort(key=lambda c: (c["sent"], c["id"]))
    return dict(
        workers=[dict(name=r["name"], id=r["id"], host=r["host"], pid=r["pid"])
                 for r in sorted(reports, key=lambda r: r["id"])],
        calls=calls,
        clocks=[dict(worker=names[i], offset=clocks_found.get(names[i], (0.0, 0.0))[0],
                     bound=clocks_found.get(names[i], (0.0, 0.0))[1]) for i in sorted(names)],
        start=start, end=end, dropped=dropped,
    )


_RECORD_FIELDS = ("id", "caller", "callee", "kind", "name", "sent", "began", "ended", "replied",
                  "thread", "request", "reply", "parent", "context", "rref", "error")


def _shifted(half: dict, offset: float) -> dict:
    half = dict(half)
    for f in ("t", "sent", "replied", "began", "ended"):
        if half.get(f) is not None:
            half[f] = half[f] + offset
    return half


def _bytes(pair) -> dict | None:
    return None if pair is None else {"tensor": int(pair[0]), "pickle": int(pair[1])}


# -- Chrome trace event format, and a table --------------------------------------------


def chrome_trace(snap: TraceSnapshot) -> dict:
    """The snapshot in Chrome's trace event format (Perfetto, chrome://tracing): one
    process per member, callee runs on their threads' lanes, the caller's send-to-reply
    intervals on lanes of their own, flow arrows request and reply."""
    pids = {w["name"]: w["id"] for w in snap["workers"]}
    events: list[dict] = []

    def pid(name: str) -> int:
        if name not in pids:
            pids[name] = max(pids.values(), default=-1) + 1
        return pids[name]

    def us(t: float) -> float:
        return round((t - snap["start"]) * 1e6, 3)

    threads: dict[tuple, int] = {}
    lanes: dict[str, list[float]] = collections.defaultdict(list)  # caller -> lane ends
    flow = itertools.count(1)
    for c in snap["calls"]:
        label = f"{c['name']} -> {c['callee']}"
        args = {k: c[k] for k in ("id", "kind", "parent", "context", "rref", "error", "request", "reply")
                if c.get(k) is not None}
        end = c["replied"] if c["replied"] is not None else (c["ended"] or c["sent"])
        lane = _lane(lanes[c["caller"]], c["sent"], end)
        caller_tid = 1_000_000 + lane
        events.append(dict(ph="X", name=label, cat="call", pid=pid(c["caller"]), tid=caller_tid,
                           ts=us(c["sent"]), dur=max(0.0, us(end) - us(c["sent"])), args=args))
        if c["began"] is None:
            continue
        key = (c["callee"], c["thread"])
        tid = threads.setdefault(key, len([k for k in threads if k[0] == c["callee"]]) + 1)
        began, ended = c["began"], c["ended"] if c["ended"] is not None else c["began"]
        events.append(dict(ph="X", name=c["name"], cat="run", pid=pid(c["callee"]), tid=tid,
                           ts=us(began), dur=max(0.0, us(ended) - us(began)), args=args))
        # Arrows: request (send -> run), reply (run's end -> reply), each inside its slices.
        request = next(flow)
        events.append(dict(ph="s", name="request", cat="rpc", id=request, pid=pid(c["caller"]),
                           tid=caller_tid, ts=us(c["sent"])))
        events.append(dict(ph="f", bp="e", name="request", cat="rpc", id=request,
                           pid=pid(c["callee"]), tid=tid, ts=max(us(began), us(c["sent"]))))
        if c["replied"] is not None and c["ended"] is not None:
            reply = next(flow)
            events.append(dict(ph="s", name="reply", cat="rpc", id=reply, pid=pid(c["callee"]),
                               tid=tid, ts=us(ended)))
            events.append(dict(ph="f", bp="e", name="reply", cat="rpc", id=reply,
                               pid=pid(c["caller"]), tid=caller_tid,
                               ts=max(us(ended), us(c["replied"]))))
    meta = []
    for name, p in pids.items():
        meta.append(dict(ph="M", name="process_name", pid=p, tid=0, ts=0, args={"name": name}))
        meta.append(dict(ph="M", name="process_sort_index", pid=p, tid=0, ts=0, args={"sort_index": p}))
    for (member, thread), tid in threads.items():
        meta.append(dict(ph="M", name="thread_name", pid=pid(member), tid=tid, ts=0,
                         args={"name": thread or "?"}))
    for member, ends in lanes.items():
        for lane in range(len(ends)):
            meta.append(dict(ph="M", name="thread_name", pid=pid(member), tid=1_000_000 + lane, ts=0,
                             args={"name": f"calls sent ({lane + 1})"}))
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"clocks": snap["clocks"], "dropped": snap["dropped"]}}


def _lane(ends: list[float], start: float, end: float) -> int:
    """The first lane free at ``start`` (caller intervals overlap when calls are async)."""
    for i, last in enumerate(ends):
        if last <= start:
            ends[i] = end
            return i
    ends.append(end)
    return len(ends) - 1


def summarize(snap: TraceSnapshot) -> list[dict]:
    """Rows per (function, callee): count, total and median seconds (send to reply, or
    the callee's run when no reply is known), bytes both ways; longest total first."""
    groups: dict[tuple, list] = collections.defaultdict(list)
    for c in snap["calls"]:
        groups[(c["name"], c["callee"])].append(c)
    rows = []
    for (name, callee), calls in groups.items():
        times = [_duration(c) for c in calls]
        times = [t for t in times if t is not None]
        rows.append(dict(
            name=name, callee=callee, kind=calls[0]["kind"], count=len(calls),
            total=sum(times), median=statistics.median(times) if times else None,
            errors=sum(c["error"] is not None for c in calls),
            request_bytes=sum(c["request"]["tensor"] + c["request"]["pickle"] for c in calls),
            reply_bytes=sum(c["reply"]["tensor"] + c["reply"]["pickle"] for c in calls if c["reply"]),
        ))
    return sorted(rows, key=lambda r: (-r["total"], r["name"], r["callee"]))


def _duration(c: dict) -> float | None:
    if c["replied"] is not None:
        return c["replied"] - c["sent"]
    if c["ended"] is not None and c["began"] is not None:
        return c["ended"] - c["began"]
    return None


# -- the user's API ---------------------------------------------------------------------


class Trace:
    """``with nbrpc.trace() as t:`` records every RPC of the block on every member.

    After the block (or during it), ``t.snapshot()`` is a ``TraceSnapshot``,
    ``t.summary()`` a table per function and callee, ``t.save("trace.json")`` a Chrome
    trace (Perfetto, chrome://tracing) and ``t.save("report.html")`` a report page.
    """

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self.start: float | None = None
        self.end: float | None = None
        self._clocks: dict | None = None
        self._snapshot: TraceSnapshot | None = None

    def __enter__(self) -> Trace:
        from . import calls

        with quiet():
            found = calls.ask_members(enable, (True,), self.timeout)
            self._members = {m["name"] for m in found}
            self._clocks = clocks.estimate_all({m["name"]: m["clock"] for m in found}, self.timeout)
        self.start = clocks.now()
        return self

    def __exit__(self, *exc) -> None:
        from . import calls

        self.end = clocks.now()
        try:
            self._snapshot = snapshot(self.start, self.end, self._clocks, self.timeout)
        finally:
            with quiet():
                calls.ask_members(enable, (False,), self.timeout)

    def snapshot(self) -> TraceSnapshot:
        """The block's calls (so far, while it runs)."""
        if self.start is None:
            raise RuntimeError("this trace has not started: use it as `with nbrpc.trace() as t:`")
        if self._snapshot is not None:
            return self._snapshot
        return snapshot(self.start, clocks.now(), self._clocks, self.timeout)

    def summary(self) -> list[dict]:
        """Per function and callee: count, total and median seconds, bytes each way."""
        return summarize(self.snapshot())

    def save(self, path) -> Path:
        """Write the trace: ``.json`` in Chrome's trace event format, ``.html`` a report."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(chrome_trace(self.snapshot())))
            return path
        if path.suffix in (".html", ".htm"):
            try:
                from .widgets.report import write_report
            except ImportError as e:
                raise RuntimeError(
                    f"cannot write {path.name}: this nbrpc has no HTML report writer "
                    "(nbrpc.widgets.report.write_report); save a .json trace instead and open it "
                    "in https://ui.perfetto.dev or chrome://tracing") from e
            write_report(self.snapshot(), path)
            return path
        raise ValueError(f"cannot save a trace as {path.name!r}: give a path ending in .json "
                         "(Chrome trace event format) or .html (report)")


def trace(timeout: float = 10.0) -> Trace:
    """Record every RPC made in a ``with`` block, on every member of the running cluster."""
    return Trace(timeout)


def trace_snapshot(last: float | None = None, timeout: float = 10.0) -> TraceSnapshot:
    """The calls of the last ``last`` seconds (default: all kept) of a cluster started
    with ``trace=True``."""
    from . import cluster as cluster_mod
    from .errors import NoClusterError

    running = cluster_mod.current()
    if running is None:
        raise NoClusterError("no cluster is running; start one with trace=True "
                             "(nbrpc.start(trace=True) or %rpc_init --trace)")
    if not getattr(running, "trace", False):
        raise RuntimeError(
            "this cluster is not recording its calls (it was started without trace=True): "
            "record a block with `with nbrpc.trace() as t:` and read t.snapshot(), or start "
            "the cluster with nbrpc.start(trace=True) / %rpc_init --trace")
    end = clocks.now()
    snap = snapshot(end - last if last is not None else float("-inf"), end, None, timeout)
    if last is None:  # from the first call kept
        snap["start"] = min((c["sent"] for c in snap["calls"]), default=end)
    return snap


_HELPERS = torch_compat.RREF_HELPERS
