"""Record the RPCs of a block on every member, and join them into one timeline.

``gather`` asks every member for its halves (``recording.recorder.report``) in
parallel; ``call_records.merge`` joins them by call id into ``CallRecord`` s on the driver's
clock (see ``recording.clocks``). ``trace()`` records a block, ``trace_snapshot`` reads a
cluster started with ``trace=True``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .._util import Hooks
from ..calls.fanout import ask_members
from ..drawing import report, summary
from ..errors import NoClusterError, NotRecordingError
from ..recording import clocks, recorder
from ..recording.recorder import enable, identity, quiet
from ..schemas import TraceSnapshot
from . import call_records

__all__ = ["Trace", "trace", "trace_snapshot"]


# ``traces()``: whether the running cluster records every call; the cluster registers one.
CLUSTER_TRACES = Hooks()


def gather(start: float | None, clocks_found: dict, timeout: float = 10.0) -> list[dict]:
    offsets = {name: offset for name, (offset, _) in clocks_found.items()}
    with quiet():
        return ask_members(recorder.report, (start, offsets), timeout)


def measure_clocks(timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """Each member's ``(offset, bound)`` from the driver's clock."""
    with quiet():
        found = ask_members(identity, (), timeout)
        return clocks.estimate_all({m["name"]: m["clock"] for m in found}, timeout)


# How far before a window's start its straddling calls are looked for: longer than
# torch's default RPC timeout (60 s), so a call that hangs until it times out is kept.
STRADDLE = 120.0


def snapshot(start: float, end: float, clocks_found: dict | None = None,
             timeout: float = 10.0, straddle: bool = False, own: bool = False) -> TraceSnapshot:
    """Every member's calls sent in [start, end] (driver's clock), joined; with
    ``straddle``, also those sent up to ``STRADDLE`` seconds before and still under way
    at ``start`` (a window that slides keeps the calls it cuts, and those in flight).
    nbrpc's own calls (``call_records.own_call``) are left out unless ``own``."""
    if clocks_found is None:
        clocks_found = measure_clocks(timeout)
    reports = gather(start - STRADDLE if straddle else start, clocks_found, timeout)
    missing = {r["name"] for r in reports} - set(clocks_found)
    if missing:  # joined since the clocks were measured
        with quiet():
            clocks_found = {**clocks_found, **clocks.estimate_all(
                {r["name"]: r["clock"] for r in reports if r["name"] in missing}, timeout)}
    return call_records.merge(reports, clocks_found, start, end, straddle=straddle, own=own)


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
        with quiet():
            found = ask_members(enable, (True,), self.timeout)
            self._members = {m["name"] for m in found}
            self._clocks = clocks.estimate_all({m["name"]: m["clock"] for m in found}, self.timeout)
        self.start = clocks.now()
        return self

    def __exit__(self, *exc) -> None:
        self.end = clocks.now()
        recorder.settle(self.start)
        try:
            self._snapshot = snapshot(self.start, self.end, self._clocks, self.timeout)
        finally:
            with quiet():
                ask_members(enable, (False,), self.timeout)

    def snapshot(self) -> TraceSnapshot:
        """The block's calls (so far, while it runs)."""
        if self.start is None:
            raise RuntimeError("this trace has not started: use it as `with nbrpc.trace() as t:`")
        if self._snapshot is not None:
            return self._snapshot
        return snapshot(self.start, clocks.now(), self._clocks, self.timeout)

    def summary(self) -> list[dict]:
        """Per function and callee: count, total and median seconds, bytes each way."""
        return summary.summarize(self.snapshot())

    def save(self, path) -> Path:
        """Write the trace: ``.json`` in Chrome's trace event format, ``.html`` a report."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(call_records.chrome_trace(self.snapshot())))
            return path
        if path.suffix in (".html", ".htm"):
            report.write_report(self.snapshot(), path)
            return path
        raise ValueError(f"cannot save a trace as {path.name!r}: give a path ending in .json "
                         "(Chrome trace event format) or .html (report)")


def trace(timeout: float = 10.0) -> Trace:
    """Record every RPC made in a ``with`` block, on every member of the running cluster."""
    return Trace(timeout)


def trace_snapshot(last: float | None = None, timeout: float = 10.0) -> TraceSnapshot:
    """The calls of the last ``last`` seconds (default: all kept) of a cluster started
    with ``trace=True``."""
    traces = CLUSTER_TRACES.first()
    if traces is None:
        raise NoClusterError("no cluster is running; start one with trace=True "
                             "(nbrpc.start(trace=True) or %rpc_init --trace)")
    if not traces:
        raise NotRecordingError(
            "this cluster is not recording its calls (it was started without trace=True): "
            "record a block with `with nbrpc.trace() as t:` and read t.snapshot(), or start "
            "the cluster with nbrpc.start(trace=True) / %rpc_init --trace")
    end = clocks.now()
    snap = snapshot(end - last if last is not None else float("-inf"), end, None, timeout,
                    straddle=last is not None)
    if last is None:  # from the first call kept
        snap["start"] = min((c["sent"] for c in snap["calls"]), default=end)
    return snap


