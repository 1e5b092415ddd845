"""The summary table's rows of a trace: per function and callee, counts, times and bytes.

Pure, over ``schemas.TraceSnapshot`` dicts; ``Trace.summary()`` and the timeline's table
are both these rows.
"""

from __future__ import annotations

import collections
import statistics

from ..schemas import TraceSnapshot


def summarize(snap: TraceSnapshot) -> list[dict]:
    """Rows per (function, callee): ``count``; ``total`` and ``median`` time (``duration``);
    median ``queue`` (sent to began); bytes each way and both; ``errors``; largest total first.
    ``Trace.summary()`` and the timeline's table are both these rows."""
    groups: dict[tuple, list] = collections.defaultdict(list)
    for c in snap.get("calls", []):
        groups[(c.get("name") or "?", c.get("callee") or "?")].append(c)
    rows = []
    for (name, callee), calls in groups.items():
        times = [t for t in map(duration, calls) if t is not None]
        queues = [c["began"] - c["sent"] for c in calls if c.get("began") is not None and c.get("sent") is not None]
        request = sum(_count(c.get("request")) for c in calls)
        reply = sum(_count(c.get("reply")) for c in calls)
        rows.append(dict(
            name=name, callee=callee, kind=calls[0].get("kind"), count=len(calls),
            total=sum(times), median=statistics.median(times) if times else None,
            queue=statistics.median(queues) if queues else None,
            errors=sum(bool(c.get("error")) for c in calls),
            request_bytes=request, reply_bytes=reply, bytes=request + reply,
        ))
    return sorted(rows, key=lambda r: (-r["total"], -r["count"], r["name"], r["callee"]))


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
