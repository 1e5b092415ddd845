"""The RPC timeline's layout and numbers: a trace snapshot in, positions and sums out.

Pure functions over ``schemas.TraceSnapshot`` dicts; nothing here imports a front
end, so the widget, the static SVG, ``write_report`` and the tutorials' checks share
them, and unit tests check them directly.

- ``window``: the calls of the last S seconds of a snapshot.
- ``timeline_layout``: one lane per member (per member and callee thread with
  ``threads``), a bar per call where it ran (the callee's began..ended), stacked in
  rows when calls overlap in a lane; a line from the caller at ``sent`` to the bar and
  back to the caller at ``replied``; the call in flight along the caller's lane; pale
  parts of a bar spent waiting on calls it made itself (``nested_waits``). Above
  ``aggregate_above`` calls, each lane's busy share over time instead (``busy_bars``).
- ``busy_intervals``, ``busy_time``, ``overlap``: when members ran calls, as merged
  intervals, for measuring (the pipeline's overlap, a server's load).
- ``ticks``: the time axis (the front end uses the same steps).
- ``colour``: a function name's colour, the same in every snapshot and process.
"""

from __future__ import annotations

import collections
import colorsys
import hashlib
import math
from dataclasses import dataclass, field

from .layout import natural_key, worker_order
from .summary import in_window

# Geometry, in SVG user units (px).
MARGIN = 10
LABEL_W = 150  # the lane names, left of the plot
PLOT_W = 760
RIGHT_PAD = 24  # room for the last tick's label
TITLE_H = 34  # one or two lines over the plot
ROW_H = 14  # one row of bars
ROW_GAP = 2
LANE_PAD = 5  # above the first row and below the last (the caller's wait line sits there)
MAX_ROWS = 4  # overlapping calls past this many rows share the last one
AXIS_H = 26
LEGEND_H = 18
MIN_BAR_W = 0.6  # a call shorter than a pixel still shows
AGGREGATE_ABOVE = 2000
BUSY = "#7f8c9a"  # an aggregated view's busy share
AGG_ROWS = 2  # an aggregated lane's height, in rows
AGG_BIN = 3.0  # an aggregated view's bin width (px)


def colour(name: str) -> str:
    """A function name's fill: one of 12 hues, 30 degrees apart, in one of two lightnesses,
    picked by its hash (MD5, not Python's salted ``hash``), so every view and process
    agrees and two names get clearly different colours or exactly the same one."""
    code = int.from_bytes(hashlib.md5(str(name).encode()).digest()[:4], "big")
    hue, light = (code % 12) / 12, (0.45, 0.62)[(code // 12) % 2]
    r, g, b = colorsys.hls_to_rgb(hue, light, 0.6)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def window(snapshot: dict, last: float | None) -> dict:
    """The snapshot's calls of its last ``last`` seconds (all of it for None): those sent
    in them, and those sent before that were still under way (or are in flight)."""
    if last is None:
        return snapshot
    if not last > 0:
        raise ValueError(f"last must be a positive number of seconds, got {last!r}")
    start = max(snapshot["start"], snapshot["end"] - last)
    return dict(snapshot, start=start, calls=[c for c in snapshot["calls"]
                                              if in_window(c, start, snapshot["end"])])


def members(snapshot: dict) -> list[str]:
    """Every member: the snapshot's, in rank order as listed, then any caller or callee not listed."""
    listed = [w["name"] for w in snapshot.get("workers", [])]
    mentioned = [c.get(k) for c in snapshot.get("calls", []) for k in ("caller", "callee")]
    return worker_order(listed, mentioned)


def ran(call: dict) -> bool:
    """The callee's part was recorded: the call has a bar."""
    return call.get("began") is not None and call.get("ended") is not None


def started(call: dict) -> bool:
    """The callee began it: it has a bar, to its end or (in flight) to the window's end."""
    return call.get("began") is not None


def span(snapshot: dict) -> tuple[float, float]:
    """The time range drawn: the snapshot's window (calls that straddle its start are cut
    there), its end widened to every recorded time."""
    times = [t for c in snapshot.get("calls", [])
             for t in (c.get("sent"), c.get("began"), c.get("ended"), c.get("replied")) if t is not None]
    t0 = snapshot["start"] if "start" in snapshot else min(times, default=0.0)
    t1 = max([snapshot.get("end", t0), *times])
    return t0, (t1 if t1 > t0 else t0 + 1e-3)


# -- measuring ------------------------------------------------------------------------


def merge(intervals, gap: float = 0.0) -> list[tuple[float, float]]:
    """Sorted, merged intervals; two closer than ``gap`` become one."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def busy_intervals(snapshot: dict, member: str, names=None, waits: bool = True) -> list[tuple[float, float]]:
    """When ``member`` ran calls (of functions in ``names``, if given), merged.

    With ``waits=False`` the time a call spent waiting on calls it made itself (an
    ``rref.to_here()`` inside it, from sent to replied) is left out: what remains is the
    time it worked (the "self time" of a profiler).
    """
    calls = [c for c in snapshot.get("calls", [])
             if c.get("callee") == member and ran(c) and (names is None or c.get("name") in names)]
    if waits:
        return merge((c["began"], c["ended"]) for c in calls)
    nested = nested_waits(snapshot.get("calls", []))
    worked = []
    for c in calls:
        at = c["began"]
        for a, b in nested.get(c["id"], []):
            if a > at:
                worked.append((at, min(a, c["ended"])))
            at = max(at, b)
        if at < c["ended"]:
            worked.append((at, c["ended"]))
    return merge(w for w in worked if w[1] > w[0])


def nested_waits(calls: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Per call id, the merged times it waited on calls it made itself (sent to replied)."""
    nested: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    callee_of = {c["id"]: c.get("callee") for c in calls}
    for c in calls:
        if c.get("parent") is not None and callee_of.get(c["parent"]) == c.get("caller"):
            nested[c["parent"]].append((c["sent"], c["replied"] if c.get("replied") is not None else math.inf))
    return {k: merge(v) for k, v in nested.items()}


def busy_time(intervals) -> float:
    return sum(b - a for a, b in intervals)


def overlap(first, second) -> float:
    """Seconds that two lists of merged intervals have in common."""
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        a, b = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        total += max(0.0, b - a)
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def clock_bound(snapshot: dict) -> tuple[float, list[str]]:
    """The largest clock bound and the members that have it (0 and [] when all are exact)."""
    bounds = {c["worker"]: float(c.get("bound") or 0) for c in snapshot.get("clocks", [])}
    worst = max(bounds.values(), default=0.0)
    return worst, sorted((w for w, b in bounds.items() if b == worst and b > 0), key=natural_key)


# -- the time axis ------------------------------------------------------------------


def tick_step(length: float, target: int = 8) -> float:
    """A step of 1, 2 or 5 times a power of ten giving about ``target`` ticks over ``length``."""
    raw = max(length, 1e-9) / target
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * power >= raw:
            return m * power
    return 10 * power


def tick_label(t: float, step: float) -> str:
    """``t`` seconds in the unit that suits ``step`` (s from 0.1 s, ms from 0.1 ms, else µs),
    with the digits the step needs."""
    unit, scale = ("s", 1.0) if step >= 0.1 else ("ms", 1e3) if step >= 1e-4 else ("\u00b5s", 1e6)
    digits = max(0, -math.floor(math.log10(step * scale) + 1e-9))
    text = f"{t * scale:.{digits}f}"
    return f"{'0' if float(text) == 0 else text} {unit}"


def ticks(a: float, b: float, target: int = 8) -> list[tuple[float, str]]:
    """Ticks over [a, b] seconds from the window's start: (seconds, label)."""
    step = tick_step(b - a, target)
    first = math.ceil(a / step - 1e-9)
    out = []
    k = first
    while k * step <= b + 1e-12:
        out.append((k * step, tick_label(k * step, step)))
        k += 1
    return out


# -- layout -------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeLane:
    """A member's (or one of its threads') band: from ``y`` down ``height``."""

    key: str  # the member, or "member/thread"
    member: str
    thread: str | None
    index: int
    y: float
    height: float
    rows: int

    @property
    def label(self) -> str:
        return self.member if self.thread is None else f"{self.member} \u00b7 {self.thread}"

    @property
    def wait_y(self) -> float:
        return self.y + self.height - 2


@dataclass(frozen=True)
class Bar:
    """A call where it ran, or (aggregated) a busy interval; x in plot units."""

    id: str
    lane: str
    x: float
    width: float
    y: float
    name: str
    fill: str
    failed: bool = False
    count: int = 1  # aggregated: the calls that ran in it
    height: float = ROW_H
    share: float = 1.0  # aggregated: the fraction of its time the lane was busy
    waits: tuple[tuple[float, float], ...] = ()  # (x, width): waiting on calls it made itself
    running: bool = False  # still running at the window's end: drawn to it


@dataclass(frozen=True)
class Segment:
    """A line: ``send`` (caller to callee), ``reply`` (back), ``wait`` (the call in flight,
    sent to replied, along the bottom of the caller's lane)."""

    id: str
    kind: str
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass
class TimelineLayout:
    lanes: dict[str, TimeLane]
    bars: list[Bar]
    segments: list[Segment]
    t0: float  # seconds at the plot's left edge, on the snapshot's clock
    t1: float
    origin: float  # the snapshot's start: axis labels count from it
    plot_x: float
    plot_y: float
    plot_w: float
    plot_h: float
    width: float
    height: float
    aggregated: bool
    calls: int
    names: list[str] = field(default_factory=list)  # functions, busiest first (the legend)

    def x(self, t: float) -> float:
        """Plot x of time ``t``."""
        return (t - self.t0) / (self.t1 - self.t0) * self.plot_w


def lane_keys(snapshot: dict, threads: bool = False) -> list[tuple[str, str, str | None]]:
    """(key, member, thread) of every lane, in member order, threads in natural order.

    With ``threads`` a member gets a lane per callee thread that ran a call there, and
    a lane of its own only where it made calls outside any call (the driver's cells).
    """
    order = members(snapshot)
    if not threads:
        return [(m, m, None) for m in order]
    used: dict[str, set] = collections.defaultdict(set)
    own: set[str] = set()
    ids = {c["id"] for c in snapshot.get("calls", [])}
    for c in snapshot.get("calls", []):
        if ran(c):
            used[c["callee"]].add(c.get("thread") or "?")
        if c.get("parent") not in ids:
            own.add(c["caller"])
    keys = []
    for m in order:
        if m in own or not used[m]:
            keys.append((m, m, None))
        keys += [(f"{m}/{t}", m, t) for t in sorted(used[m], key=natural_key)]
    return keys


def _callee_lane(call: dict, threads: bool) -> str:
    return f"{call['callee']}/{call.get('thread') or '?'}" if threads else call["callee"]


def _caller_lane(call: dict, by_id: dict, lanes: dict, threads: bool) -> str:
    parent = by_id.get(call.get("parent"))
    if threads and parent is not None and parent["callee"] == call["caller"] and ran(parent):
        return _callee_lane(parent, True)
    if call["caller"] in lanes:
        return call["caller"]
    return next(k for k, lane in lanes.items() if lane.member == call["caller"])


def pack_rows(intervals: list[tuple[str, float, float]]) -> dict[str, int]:
    """A row per interval id: greedy, earliest first, so overlapping calls stack."""
    ends: list[float] = []
    rows = {}
    for key, a, b in sorted(intervals, key=lambda i: (i[1], i[2], natural_key(i[0]))):
        row = next((r for r, end in enumerate(ends) if end <= a), None)
        if row is None and len(ends) < MAX_ROWS:
            row = len(ends)
            ends.append(b)
        elif row is None:
            row = min(range(len(ends)), key=lambda r: ends[r])
        ends[row] = max(ends[row], b)
        rows[key] = row
    return rows


def timeline_layout(snapshot: dict, threads: bool = False, aggregate_above: int | None = AGGREGATE_ABOVE,
                    plot_w: float = PLOT_W) -> TimelineLayout:
    """Lanes, bars and lines of ``snapshot``; see the module docstring."""
    calls = sorted(snapshot.get("calls", []), key=lambda c: (c["sent"], natural_key(c["id"])))
    aggregated = aggregate_above is not None and len(calls) > aggregate_above
    t0, t1 = span(snapshot)
    keys = lane_keys(snapshot, threads)
    # Rows per lane, from the intervals drawn there (aggregated: two rows' height).
    drawn: dict[str, list[tuple[str, float, float]]] = collections.defaultdict(list)
    for c in calls:
        if started(c) and not aggregated:
            drawn[_callee_lane(c, threads)].append((c["id"], c["began"], _run_end(c, t1)))
    rows_of = {key: pack_rows(drawn[key]) for key, _, _ in keys}
    lanes: dict[str, TimeLane] = {}
    y = MARGIN + TITLE_H
    for index, (key, member, thread) in enumerate(keys):
        rows = AGG_ROWS if aggregated else max(rows_of[key].values(), default=0) + 1
        height = 2 * LANE_PAD + rows * ROW_H + (rows - 1) * ROW_GAP
        lanes[key] = TimeLane(key, member, thread, index, y, height, rows)
        y += height
    plot_y, plot_h = MARGIN + TITLE_H, y - (MARGIN + TITLE_H)
    place = TimelineLayout(lanes, [], [], t0, t1, snapshot.get("start", t0), MARGIN + LABEL_W, plot_y,
                           plot_w, plot_h, 2 * MARGIN + LABEL_W + plot_w + RIGHT_PAD,
                           y + AXIS_H + LEGEND_H + MARGIN, aggregated, len(calls))

    if aggregated:
        place.bars = busy_bars(calls, place, threads)
    else:
        call_marks(calls, place, rows_of, threads)
    return place


def call_marks(calls: list[dict], place: TimelineLayout, rows_of: dict[str, dict[str, int]],
               threads: bool) -> None:
    """Fill ``place`` with a bar per call that ran (in its row of its lane), its lines to
    and from the caller, the call in flight along the caller's lane, and the legend's names."""
    lanes, scale = place.lanes, place.plot_w / (place.t1 - place.t0)
    by_id = {c["id"]: c for c in calls}
    nested = nested_waits(calls)
    by_name: collections.Counter = collections.Counter()
    for c in calls:
        caller_key = _caller_lane(c, by_id, lanes, threads)
        if started(c):
            key, name = _callee_lane(c, threads), c.get("name") or "?"
            top = lanes[key].y + LANE_PAD + rows_of[key][c["id"]] * (ROW_H + ROW_GAP)
            ended = _run_end(c, place.t1)
            by_name[name] += ended - c["began"]
            waits = tuple((place.x(max(a, c["began"])), (min(b, ended) - max(a, c["began"])) * scale)
                          for a, b in nested.get(c["id"], []) if min(b, ended) > max(a, c["began"]))
            place.bars.append(Bar(c["id"], key, place.x(c["began"]),
                                  max(MIN_BAR_W, (ended - c["began"]) * scale), top, name, colour(name),
                                  bool(c.get("error")), waits=waits, running=c.get("ended") is None))
            if caller_key != key:
                mid, cy = top + ROW_H / 2, lanes[caller_key].wait_y
                place.segments.append(Segment(c["id"], "send", place.x(c["sent"]), cy, place.x(c["began"]), mid))
                if c.get("replied") is not None and c.get("ended") is not None:
                    place.segments.append(Segment(c["id"], "reply", place.x(c["ended"]), mid,
                                                  place.x(c["replied"]), cy))
        end = c.get("replied") if c.get("replied") is not None else place.t1
        wy = lanes[caller_key].wait_y
        place.segments.append(Segment(c["id"], "wait", place.x(c["sent"]), wy, place.x(end), wy))
    place.names = sorted(by_name, key=lambda n: (-by_name[n], natural_key(n)))


def _run_end(call: dict, t1: float) -> float:
    """Where a started call's bar ends: its end, or the window's end while it runs."""
    return call["ended"] if call.get("ended") is not None else max(t1, call["began"])


def busy_bars(calls: list[dict], place: TimelineLayout, threads: bool) -> list[Bar]:
    """An aggregated view: each lane's busy share per bin of ``AGG_BIN`` px, as bars whose
    height is the share (runs of bins with the same share, in 5% steps, are one bar).

    Linear in calls plus bins (a call longer than a bin adds to each bin it spans).
    """
    bins = max(1, int(place.plot_w / AGG_BIN))
    step = (place.t1 - place.t0) / bins
    busy = {key: [0.0] * bins for key in place.lanes}
    count = {key: [0] * bins for key in place.lanes}
    for c in calls:
        if not ran(c):
            continue
        key = _callee_lane(c, threads)
        first = min(bins - 1, int((c["began"] - place.t0) / step))
        last = min(bins - 1, int((c["ended"] - place.t0) / step))
        count[key][first] += 1
        for k in range(first, last + 1):
            a, b = place.t0 + k * step, place.t0 + (k + 1) * step
            busy[key][k] += max(0.0, min(b, c["ended"]) - max(a, c["began"]))
    bars = []
    full = AGG_ROWS * ROW_H + (AGG_ROWS - 1) * ROW_GAP
    for key, lane in place.lanes.items():
        runs: list[list] = []  # [first bin, last bin, share, calls]
        for k in range(bins):
            share = min(1.0, round(busy[key][k] / step * 20) / 20)
            if share == 0 and not count[key][k]:
                continue
            share = max(share, 0.05)
            if runs and runs[-1][1] == k - 1 and runs[-1][2] == share:
                runs[-1][1], runs[-1][3] = k, runs[-1][3] + count[key][k]
            else:
                runs.append([k, k, share, count[key][k]])
        bottom = lane.y + LANE_PAD + full
        for n, (a, b, share, calls_in) in enumerate(runs):
            height = full * share
            bars.append(Bar(f"busy:{key}:{n}", key, a * AGG_BIN * place.plot_w / (bins * AGG_BIN),
                            (b - a + 1) * place.plot_w / bins, bottom - height, "busy", BUSY,
                            count=calls_in, height=height, share=share))
    return bars
