"""Call records from members' halves, and what is made of them (pure functions).

``merge`` joins the halves every member reported (``tracing.report``) by call id
into ``CallRecord`` s on the driver's clock; ``chrome_trace`` and ``summarize`` turn
the resulting ``TraceSnapshot`` into Chrome's trace event format (Perfetto,
chrome://tracing) and a table per function and callee.
"""

from __future__ import annotations

import collections
import itertools

from ..drawing.summary import in_window
from ..schemas import CallRecord, TraceSnapshot

__all__ = ["chrome_trace", "in_window", "merge", "own_call"]

_CALLER_FIELDS = ("caller", "callee", "kind", "name", "sent", "replied", "request", "reply",
                  "parent", "context", "rref", "error")


# Calls of torch's that nbrpc's bookkeeping makes, not the user: the RRef type queries
# that naming an RRef helper call makes. (nbrpc's own functions are never recorded:
# ``recording.functions.own``.)
BOOKKEEPING = ("_rref_typeof_on_owner",)


def own_call(call: dict) -> bool:
    """Whether a call (record or caller half) is nbrpc's bookkeeping rather than the user's."""
    return (call.get("name") or "").rsplit(".", 1)[-1] in BOOKKEEPING


def merge(reports: list[dict], clocks_found: dict, start: float, end: float,
          own: bool = False, straddle: bool = False) -> TraceSnapshot:
    """Join members' halves into call records on the driver's clock (pure): the calls
    ``in_window`` (with ``straddle``, also those under way at ``start``), without nbrpc's
    own (``own_call``) unless ``own``."""
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
        e = callees.pop(key, None) or {}
        if not in_window({**c, "ended": e.get("ended")}, start, end, straddle) or (not own and own_call(c)):
            continue
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
        sent, sent_dur = us(c["sent"]), max(0.0, us(end) - us(c["sent"]))
        events.append(dict(ph="X", name=label, cat="call", pid=pid(c["caller"]), tid=caller_tid,
                           ts=sent, dur=sent_dur, args=args))
        if c["began"] is None:
            continue
        key = (c["callee"], c["thread"])
        tid = threads.setdefault(key, len([k for k in threads if k[0] == c["callee"]]) + 1)
        ended = c["ended"] if c["ended"] is not None else c["began"]
        began, run_dur = us(c["began"]), max(0.0, us(ended) - us(c["began"]))
        events.append(dict(ph="X", name=c["name"], cat="run", pid=pid(c["callee"]), tid=tid,
                           ts=began, dur=run_dur, args=args))
        # Arrows: request (send -> run), reply (run's end -> reply), each end inside its
        # slice even where the members' clocks, aligned to within a few ms, disagree. A
        # slice ends at ts + dur exactly (not at us(end), which may differ in the last bit).
        request = next(flow)
        events.append(dict(ph="s", name="request", cat="rpc", id=request, pid=pid(c["caller"]),
                           tid=caller_tid, ts=sent))
        events.append(dict(ph="f", bp="e", name="request", cat="rpc", id=request,
                           pid=pid(c["callee"]), tid=tid, ts=min(max(began, sent), began + run_dur)))
        if c["replied"] is not None and c["ended"] is not None:
            reply = next(flow)
            events.append(dict(ph="s", name="reply", cat="rpc", id=reply, pid=pid(c["callee"]),
                               tid=tid, ts=began + run_dur))
            events.append(dict(ph="f", bp="e", name="reply", cat="rpc", id=reply,
                               pid=pid(c["caller"]), tid=caller_tid,
                               ts=min(max(began + run_dur, sent), sent + sent_dur)))
    meta = _chrome_names(pids, threads, lanes)
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"clocks": snap["clocks"], "dropped": snap["dropped"]}}


def _chrome_names(pids: dict[str, int], threads: dict[tuple, int], lanes: dict[str, list[float]]) -> list[dict]:
    """Chrome's metadata events: each member's process and each lane's thread by name."""
    meta = []
    for name, p in pids.items():
        meta.append(dict(ph="M", name="process_name", pid=p, tid=0, ts=0, args={"name": name}))
        meta.append(dict(ph="M", name="process_sort_index", pid=p, tid=0, ts=0, args={"sort_index": p}))
    for (member, thread), tid in threads.items():
        meta.append(dict(ph="M", name="thread_name", pid=pids[member], tid=tid, ts=0,
                         args={"name": thread or "?"}))
    for member, ends in lanes.items():
        for lane in range(len(ends)):
            meta.append(dict(ph="M", name="thread_name", pid=pids[member], tid=1_000_000 + lane, ts=0,
                             args={"name": f"calls sent ({lane + 1})"}))
    return meta


def _lane(ends: list[float], start: float, end: float) -> int:
    """The first lane free at ``start`` (caller intervals overlap when calls are async)."""
    for i, last in enumerate(ends):
        if last <= start:
            ends[i] = end
            return i
    ends.append(end)
    return len(ends) - 1
