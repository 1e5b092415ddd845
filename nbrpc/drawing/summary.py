"""The summary table's rows of a trace: per function and callee, counts, times and bytes;
and which calls belong to a window of time (``in_window``).

Pure, over ``schemas.TraceSnapshot`` dicts; ``Trace.summary()`` and the timeline's table
are both these rows.
"""

from __future__ import annotations

import collections
import statistics

from ..schemas import TraceSnapshot


def in_window(call: dict, start: float, end: float, straddle: bool = True) -> bool:
    """A call belongs to [start, end] if it was sent in it, or (``straddle``) sent before
    it and not over by ``start``: under way at the start, or still in flight (no reply,
    no end, no error: a call refused before it left has only its error)."""
    if call["sent"] > end:
        return False
    if not straddle:
        return call["sent"] >= start
    if call["sent"] >= start:
        return True
    last = [t for t in (call.get("replied"), call.get("ended")) if t is not None]
    if not last:  # in flight, unless it failed without leaving (its error is its end)
        return call.get("error") is None
    return max(last) >= start


def summarize(snap: TraceSnapshot) -> list[dict]:
    """Rows per (function, callee): ``count``; ``total`` (the calls' times summed: calls
    that overlap count each) and ``median`` time (``duration``); ``wall``, the time
    during which at least one of them was under way (overlaps counted once);
    median ``queue`` (sent to began); bytes each way and both; ``errors``; largest total first.
    ``Trace.summary()`` and the timeline's table are both these rows."""
    groups: dict[tuple, list] = collections.defaultdict(list)
    for c in snap.get("calls", []):
        groups[(c.get("name") or "?", c.get("callee") or "?")].append(c)
    rows = []
    for (name, callee), calls in groups.items():
        times = [t for t in map(duration, calls) if t is not None]
        spans = [x for x in map(_span, calls) if x is not None]
        queues = [c["began"] - c["sent"] for c in calls if c.get("began") is not None and c.get("sent") is not None]
        request = sum(_count(c.get("request")) for c in calls)
        reply = sum(_count(c.get("reply")) for c in calls)
        rows.append(dict(
            name=name, callee=callee, kind=calls[0].get("kind"), count=len(calls),
            total=sum(times), wall=_covered(spans), median=statistics.median(times) if times else None,
            queue=statistics.median(queues) if queues else None,
            errors=sum(bool(c.get("error")) for c in calls),
            request_bytes=request, reply_bytes=reply, bytes=request + reply,
        ))
    return sorted(rows, key=lambda r: (-r["total"], -r["count"], r["name"], r["callee"]))


def _span(call: dict) -> tuple[float, float] | None:
    """The interval ``duration`` measures."""
    if call.get("replied") is not None and call.get("sent") is not None:
        return call["sent"], call["replied"]
    if call.get("ended") is not None and call.get("began") is not None:
        return call["began"], call["ended"]
    return None


def _covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``spans``."""
    covered, reach = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered


def duration(call: dict) -> float | None:
    """A call's time: from sent to its reply (what the caller waited), or the callee's
    run when no reply is known; None when neither is."""
    if call.get("replied") is not None and call.get("sent") is not None:
        return call["replied"] - call["sent"]
    if call.get("ended") is not None and call.get("began") is not None:
        return call["ended"] - call["began"]
    return None


def _count(part: dict | None) -> int:
    return 0 if not part else int(part.get("tensor") or 0) + int(part.get("pickle") or 0)
