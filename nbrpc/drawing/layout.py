"""Deterministic layouts: a snapshot in, positions out.

Pure functions over the plain dicts of ``nbrpc.rref_snapshot`` and
``nbrpc.autograd_snapshot``; nothing here imports a front end, so the same positions
feed the widget and the static SVG, and unit tests check them directly.

- ``rref_layout``: one lane (a column) per worker, in the snapshot's worker order;
  each RRef sits in its owner's lane on a grid of ``LANE_COLUMNS`` cells, in RRef id
  order, so a refresh that adds RRefs never moves the others. Linear in the number of
  RRefs (plus the sort by id).
- ``autograd_layout``: one lane per worker; functions are layered by their longest
  distance from the loss over every edge (local and rpc), so the backward pass reads
  top to bottom and an rpc edge always points down into the other lane. Within a lane
  and layer, functions are ordered by the mean slot of their parents (one pass).
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

# Geometry, in SVG user units (px).
MARGIN = 12
LANE_GAP = 16
LANE_PAD = 10
HEADER_H = 46
FORK_BAND = 44  # room above the lane headers for fork-history arcs
CELL = 24  # one RRef's grid cell
LANE_COLUMNS = 6
NODE_R = 7
AGG_R = 22  # the per-owner node of an aggregated view
AGG_DROP = 40
FN_W, FN_H = 150, 26  # an autograd function's box (the narrowest; wider for longer labels)
FN_W_MAX = 300
CHAR_W = 6.6  # an 11 px sans-serif character, a little generously (labels must fit their box)
FN_GAP_X, LAYER_H = 12, 52
GRAD_H = 16  # room under a leaf for its gradient norm
LANE_MIN_W = 2 * LANE_PAD + LANE_COLUMNS * CELL


@dataclass(frozen=True)
class Lane:
    """A worker's column: its header box sits at the top, from ``y`` to ``y + HEADER_H``."""

    worker: str
    index: int
    x: float
    y: float
    width: float
    height: float

    @property
    def center(self) -> float:
        return self.x + self.width / 2

    @property
    def header_bottom(self) -> float:
        return self.y + HEADER_H


@dataclass
class Layout:
    """Lanes by worker, a position per item id, and the overall size."""

    lanes: dict[str, Lane]
    positions: dict[str, tuple[float, float]]
    width: float
    height: float
    layers: dict[str, int] = field(default_factory=dict)
    box_w: dict[str, float] = field(default_factory=dict)  # an autograd lane's box width


def label_chars(width: float) -> int:
    """How many characters of an 11 px label fit a box ``width`` px wide."""
    return max(4, int((width - 12) / CHAR_W))


def box_width(labels) -> float:
    """A function box wide enough for the longest of ``labels``, within FN_W..FN_W_MAX."""
    longest = max((len(t) for t in labels), default=0)
    return min(FN_W_MAX, max(FN_W, 12 + CHAR_W * longest))


def natural_key(text: str) -> tuple:
    """Sort key that puts ``"0:2"`` before ``"0:10"`` and ``"w1:3"`` before ``"w1:12"``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(text)))


def worker_order(listed: list[str], mentioned) -> list[str]:
    """The snapshot's workers in order, then any other name mentioned (sorted)."""
    order = list(dict.fromkeys(listed))
    known = set(order)
    return order + sorted({m for m in mentioned if m is not None and m not in known}, key=natural_key)


def rref_workers(snapshot: dict) -> list[str]:
    """Every worker of an RRef snapshot: listed members, then owners and holders not listed."""
    mentioned = []
    for r in snapshot.get("rrefs", []):
        mentioned.append(r.get("owner"))
        mentioned.extend(r.get("holders") or [])
    return worker_order([w["name"] for w in snapshot.get("workers", [])], mentioned)


def rref_order(snapshot: dict) -> dict[str, list[dict]]:
    """RRefs grouped by owner, each group in id order."""
    by_owner: dict[str, list[dict]] = collections.defaultdict(list)
    for r in sorted(snapshot.get("rrefs", []), key=lambda r: natural_key(r["id"])):
        by_owner[r["owner"]].append(r)
    return by_owner


def has_forks(snapshot: dict) -> bool:
    """Whether the snapshot's events hold a fork between two different workers."""
    return any(e.get("kind") == "fork" and e.get("from") and e.get("to") and e.get("from") != e.get("to")
               for e in snapshot.get("events", []))


def rref_layout(snapshot: dict, aggregate: bool = False, forks: bool = True) -> Layout:
    """Lanes and RRef positions; with ``aggregate``, one node per owner (id ``owner``).
    The band for fork arcs is there only when ``forks`` are drawn and there are some."""
    workers = rref_workers(snapshot)
    by_owner = rref_order(snapshot)
    top = MARGIN + (FORK_BAND if forks and has_forks(snapshot) else 0)
    lanes, positions = {}, {}
    tallest = 0.0
    for i, name in enumerate(workers):
        x = MARGIN + i * (LANE_MIN_W + LANE_GAP)
        grid_top = top + HEADER_H + LANE_PAD
        owned = by_owner.get(name, [])
        if aggregate:
            # Room above the node, so edges to holders leave it upwards, not sideways.
            body = AGG_DROP + 2 * AGG_R + 2 * LANE_PAD
            if owned:
                positions[name] = (x + LANE_MIN_W / 2, grid_top + AGG_DROP + AGG_R)
        else:
            rows = -(-len(owned) // LANE_COLUMNS)
            body = max(rows, 1) * CELL + LANE_PAD
            for k, r in enumerate(owned):
                row, col = divmod(k, LANE_COLUMNS)
                positions[r["id"]] = (x + LANE_PAD + (col + 0.5) * CELL, grid_top + (row + 0.5) * CELL)
        height = HEADER_H + LANE_PAD + body
        tallest = max(tallest, height)
        lanes[name] = Lane(name, i, x, top, LANE_MIN_W, height)
    for name, lane in lanes.items():
        lanes[name] = Lane(lane.worker, lane.index, lane.x, lane.y, lane.width, tallest)
    width = 2 * MARGIN + len(workers) * LANE_MIN_W + max(len(workers) - 1, 0) * LANE_GAP
    return Layout(lanes, positions, max(width, 2 * MARGIN + LANE_MIN_W), top + tallest + MARGIN)


def autograd_layers(snapshot: dict) -> dict[str, int]:
    """Each function's layer: its longest distance from a root (the loss) over all edges.

    Kahn's topological order, so linear in functions plus edges. Functions on a cycle
    (a malformed snapshot) go one layer below everything else instead of looping.
    """
    ids = [n["id"] for n in snapshot.get("nodes", [])]
    known = set(ids)
    children: dict[str, list[str]] = collections.defaultdict(list)
    indegree = dict.fromkeys(ids, 0)
    for e in snapshot.get("edges", []):
        if e["src"] in known and e["dst"] in known:
            children[e["src"]].append(e["dst"])
            indegree[e["dst"]] += 1
    layer = dict.fromkeys(ids, 0)
    ready = collections.deque(sorted((i for i in ids if indegree[i] == 0), key=natural_key))
    done = set()
    while ready:
        node = ready.popleft()
        done.add(node)
        for child in children[node]:
            layer[child] = max(layer[child], layer[node] + 1)
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(done) < len(ids):
        deepest = max((layer[i] for i in done), default=-1) + 1
        for i in ids:
            if i not in done:
                layer[i] = deepest
    return layer


def autograd_workers(snapshot: dict) -> list[str]:
    """Workers that hold a part of the graph, in the snapshot's order.

    Torch enlists every worker that an RPC reaches inside a context, nbrpc's own
    snapshot calls included, so a worker can hold an empty part: it gets no lane
    (unless no worker holds any function).
    """
    present = {n.get("worker") for n in snapshot.get("nodes", [])}
    order = worker_order(snapshot.get("workers", []), present)
    return [w for w in order if w in present] or order


def autograd_layout(snapshot: dict) -> Layout:
    """Lanes per worker, a position (the box's centre) per function id, and layers."""
    layer = autograd_layers(snapshot)
    workers = autograd_workers(snapshot)
    parents: dict[str, list[str]] = collections.defaultdict(list)
    for e in snapshot.get("edges", []):
        parents[e["dst"]].append(e["src"])
    rows: dict[tuple[str, int], list[str]] = collections.defaultdict(list)
    for n in sorted(snapshot.get("nodes", []), key=lambda n: natural_key(n["id"])):
        rows[(n["worker"], layer[n["id"]])].append(n["id"])
    depth = max(layer.values(), default=0) + 1
    widest = {w: max((len(rows[(w, d)]) for d in range(depth)), default=0) for w in workers}
    # Slot of each function inside its row, decided layer by layer so parents come first.
    slot: dict[str, float] = {}
    for d in range(depth):
        for w in workers:
            first = {fn: k for k, fn in enumerate(rows.get((w, d), []))}

            def pull(fn: str, first=first) -> tuple:
                seen = [slot[p] for p in parents[fn] if p in slot]
                return (sum(seen) / len(seen) if seen else first[fn], natural_key(fn))

            ordered = sorted(first, key=pull)
            slot.update((fn, k) for k, fn in enumerate(ordered))
            rows[(w, d)] = ordered
    top = MARGIN
    lanes, positions = {}, {}
    x = MARGIN
    height = HEADER_H + LANE_PAD + depth * LAYER_H + GRAD_H
    labels: dict[str, list[str]] = collections.defaultdict(list)
    for n in snapshot.get("nodes", []):
        labels[n["worker"]].append(n.get("param") or n.get("name") or "?")
    box_w = {}
    for i, w in enumerate(workers):
        fn_w = box_w[w] = box_width(labels[w])
        lane_w = max(LANE_MIN_W, 2 * LANE_PAD + widest[w] * fn_w + max(widest[w] - 1, 0) * FN_GAP_X)
        lanes[w] = Lane(w, i, x, top, lane_w, height)
        for d in range(depth):
            row = rows.get((w, d), [])
            span = len(row) * fn_w + max(len(row) - 1, 0) * FN_GAP_X
            left = x + (lane_w - span) / 2
            for k, fn in enumerate(row):
                positions[fn] = (left + k * (fn_w + FN_GAP_X) + fn_w / 2,
                                 top + HEADER_H + LANE_PAD + d * LAYER_H + FN_H / 2 + 6)
        x += lane_w + LANE_GAP
    width = max(x - LANE_GAP + MARGIN, 2 * MARGIN + LANE_MIN_W)
    return Layout(lanes, positions, width, top + height + MARGIN, layers=layer, box_w=box_w)
