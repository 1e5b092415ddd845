"""Where each part of the wait-for graph goes: lanes per member, a row per pending call.

Parts:

- ``WaitsLayout``: the lanes (one column per member, the driver's first, in the
  snapshot's order), one ``Arrow`` per pending call (a row each, in chain order, from the
  caller's lane to the callee's; a call back into its own member is a ``loop``), the
  "waits on" links between a served call and the calls its thread made, and the
  findings' lines under the rows.
- ``waits_layout(snapshot)``: that layout, pure and deterministic.

A call named by any finding is ``alarm``: drawn in red, as its finding is.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

LANE_W = 170  # a member's column
LANE_GAP = 36
MARGIN = 12
HEADER_H = 40  # name, then state and busy threads
ROW_H = 46  # one pending call: its label above, its arrow, a note under it
LOOP_W = 26  # how far a call back into its own member loops out of its lane
FINDING_LINE = 14
FINDING_CHARS = 110  # a finding's message wraps at this many characters (at least)
EMPTY_H = 28


@dataclass(frozen=True)
class Lane:
    member: str
    index: int
    x: float
    width: float
    state: str  # running | gone | frozen
    busy: int
    threads: int | None

    @property
    def center(self) -> float:
        return self.x + self.width / 2


@dataclass(frozen=True)
class Arrow:
    call: dict
    y: float
    x1: float  # the caller's lane
    x2: float  # the callee's lane
    loop: bool  # a call back into the same member
    alarm: bool  # named by a finding


@dataclass
class WaitsLayout:
    lanes: dict[str, Lane] = field(default_factory=dict)
    arrows: list[Arrow] = field(default_factory=list)
    links: list[tuple[Arrow, Arrow]] = field(default_factory=list)  # (waiting call, call it waits on)
    findings: list[tuple[dict, list[str], float]] = field(default_factory=list)  # (finding, lines, y)
    width: float = 0.0
    height: float = 0.0
    lanes_bottom: float = 0.0


def members_of(snapshot: dict) -> list[dict]:
    """The snapshot's members, plus any member a call names that it lacks (as gone)."""
    members = [dict(m) for m in snapshot.get("members", [])]
    known = {m["name"] for m in members}
    for call in snapshot.get("calls", []):
        for name in (call.get("caller"), call.get("callee")):
            if name and name not in known:
                known.add(name)
                members.append({"name": name, "state": "gone", "busy": 0, "threads": None})
    return members


def alarmed(snapshot: dict) -> set[str]:
    """The ids of the calls any finding names."""
    return {cid for f in snapshot.get("findings", []) for cid in f.get("calls", [])}


def chain_order(calls: list[dict]) -> list[dict]:
    """Calls in the order their chains read: each call nothing waits on (oldest first),
    then the calls it waits on, depth first; members' clocks differ, so ``since`` alone
    can put a nested call above the call that made it."""
    by_id = {c["id"]: c for c in calls}
    waited = {w for c in calls for w in c.get("waits_on") or []}
    out: list[dict] = []
    seen: set[str] = set()

    def visit(call: dict) -> None:
        stack = [call]
        while stack:
            c = stack.pop()
            if c["id"] in seen:
                continue
            seen.add(c["id"])
            out.append(c)
            stack.extend(by_id[w] for w in reversed(c.get("waits_on") or []) if w in by_id)

    for call in [c for c in calls if c["id"] not in waited] + calls:  # then cycles with no head
        visit(call)
    return out


def waits_layout(snapshot: dict) -> WaitsLayout:
    """Lanes, arrows, links and findings' lines of a waits snapshot (``nbrpc.waits()``)."""
    out = WaitsLayout()
    members = members_of(snapshot)
    for i, m in enumerate(members):
        out.lanes[m["name"]] = Lane(m["name"], i, MARGIN + i * (LANE_W + LANE_GAP), LANE_W,
                                    m.get("state", "running"), int(m.get("busy") or 0), m.get("threads"))
    red = alarmed(snapshot)
    y = MARGIN + HEADER_H + ROW_H * 0.7
    by_id: dict[str, Arrow] = {}
    for call in chain_order(snapshot.get("calls", [])):
        src, dst = out.lanes[call["caller"]], out.lanes[call["callee"]]
        arrow = Arrow(call, y, src.center, dst.center, src.member == dst.member, call["id"] in red)
        out.arrows.append(arrow)
        by_id[call["id"]] = arrow
        y += ROW_H
    if not out.arrows:
        y += EMPTY_H - ROW_H * 0.7
    for arrow in out.arrows:
        for other in arrow.call.get("waits_on") or []:
            if other in by_id:
                out.links.append((arrow, by_id[other]))
    out.lanes_bottom = y - ROW_H * 0.3
    lanes_width = MARGIN * 2 + len(members) * LANE_W + max(len(members) - 1, 0) * LANE_GAP
    out.width = max(lanes_width, 360)
    chars = max(FINDING_CHARS, int((out.width - 2 * MARGIN) / 6.2))
    y = out.lanes_bottom + MARGIN + FINDING_LINE
    for finding in snapshot.get("findings", []):
        text = f"{finding['kind']}: {finding['message']}"
        lines = textwrap.wrap(text, chars) or [text]
        out.findings.append((finding, lines, y))
        y += FINDING_LINE * len(lines) + 6
    widest = max((len(line) for _, lines, _ in out.findings for line in lines), default=0)
    out.width = max(out.width, 2 * MARGIN + widest * 6.2)
    out.height = y if out.findings else out.lanes_bottom + MARGIN
    return out
