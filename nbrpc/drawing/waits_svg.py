"""The wait-for graph as SVG: what ``WaitsGraph`` shows and its static fallback keeps.

Parts: ``waits_svg(snapshot)`` (the drawing), ``waits_details(snapshot)`` (hover
details by call id, as ``describe.py`` makes them for the other graphs),
and ``waits_summary(snapshot)`` (one line of text).

As ``svg.py``'s drawings: deterministic, colours as presentation attributes (GitHub
and nbviewer draw them), and each themed item carries a role class (``nbrpc-ink``,
``nbrpc-muted``, ``nbrpc-line``, and ``nbrpc-alarm`` for what the findings name) that
``svg.THEME_CSS`` maps to JupyterLab's CSS variables, so the drawing follows the light,
dark and high-contrast themes where they exist. Items the front end uses carry
``data-id`` (a call's id, the key of its details), ``data-workers`` (the filter) and
``data-lane``; class ``nbrpc-call`` on each call's arrow, ``nbrpc-waits-on`` on the
links from a served call to the calls it waits on, ``nbrpc-finding`` (with
``data-kind``) on each finding's text.
"""

from __future__ import annotations

from . import waits_layout as wl
from .svg import FONT, INK, PALETTE, _arrow, box, clip, esc, num, theme_style, title

# Fallback inks (no theme variables: GitHub, nbviewer): each reads at 4.5:1 or more on
# white and on every lane's tint.
MUTED = "#595959"
ALARM = "#b71c1c"
# Members' colours as in the other views, less the reds: red says stuck here.
LANE_COLOURS = tuple(c for c in PALETTE if c not in ("#e15759", "#ff9da7"))


def waits_svg(snapshot: dict, *, titles: bool = True) -> str:
    """The wait-for graph of a waits snapshot (``nbrpc.waits()``) as one SVG string."""
    places = wl.waits_layout(snapshot)
    details = waits_details(snapshot) if titles else {}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="nbrpc-svg" data-kind="waits" '
             f'{box(places.width, places.height)} {FONT}>']
    parts.extend(_lane(lane, places.lanes_bottom) for lane in places.lanes.values())
    if not places.arrows:
        parts.append(f'<text class="nbrpc-muted nbrpc-empty" x="{num(wl.MARGIN)}" '
                     f'y="{num(wl.MARGIN + wl.HEADER_H + 18)}" fill="{MUTED}">no call is pending</text>')
    parts.append('<g class="nbrpc-links" fill="none">')
    parts.extend(_link(a, b) for a, b in places.links)
    parts.append("</g>")
    parts.extend(_call(arrow, details.get(arrow.call["id"])) for arrow in places.arrows)
    for finding, lines, y in places.findings:
        related = esc(" ".join(finding.get("members", [])))
        spans = "".join(f'<tspan x="{num(wl.MARGIN)}" dy="{0 if i == 0 else wl.FINDING_LINE}">'
                        f'{esc(line)}</tspan>' for i, line in enumerate(lines))
        parts.append(f'<text class="nbrpc-finding nbrpc-alarm" data-kind="{esc(finding["kind"])}" '
                     f'data-workers="{related}" x="{num(wl.MARGIN)}" y="{num(y)}" fill="{ALARM}">'
                     f'{spans}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _lane(lane: wl.Lane, bottom: float) -> str:
    fill = LANE_COLOURS[lane.index % len(LANE_COLOURS)]
    dead = lane.state != "running"
    pool = f"{lane.busy}/{lane.threads} threads busy" if lane.threads else f"{lane.busy} busy"
    sub = lane.state if dead else pool
    stroke = (f'class="nbrpc-alarm" stroke="{ALARM}" stroke-width="2"' if dead
              else f'stroke="{fill}" stroke-opacity="0.4"')
    sub_role, sub_fill = ("nbrpc-alarm", ALARM) if dead else ("nbrpc-muted", MUTED)
    top = wl.MARGIN
    return (f'<g class="nbrpc-lane" data-lane="{esc(lane.member)}" data-workers="{esc(lane.member)}" '
            f'data-state="{esc(lane.state)}">'
            f'<rect x="{num(lane.x)}" y="{num(top)}" width="{num(lane.width)}" height="{num(bottom - top)}" '
            f'rx="6" fill="{fill}" fill-opacity="0.05" {stroke}/>'
            f'<rect x="{num(lane.x)}" y="{num(top)}" width="{num(lane.width)}" height="{wl.HEADER_H}" '
            f'rx="6" fill="{fill}" fill-opacity="0.2"/>'
            f'<text class="nbrpc-ink" x="{num(lane.center)}" y="{num(top + 16)}" text-anchor="middle" '
            f'font-weight="bold" fill="{INK}">{esc(clip(lane.member, 24))}</text>'
            f'<text class="{sub_role}" x="{num(lane.center)}" y="{num(top + 30)}" text-anchor="middle" '
            f'font-size="10" fill="{sub_fill}">{esc(sub)}</text></g>')


def _call(arrow: wl.Arrow, details: dict | None) -> str:
    call = arrow.call
    role, stroke = ("nbrpc-alarm", ALARM) if arrow.alarm else ("nbrpc-line", MUTED)
    ink_role, ink = ("nbrpc-alarm", ALARM) if arrow.alarm else ("nbrpc-ink", INK)
    dash = ' stroke-dasharray="5 3"' if call.get("state") == "queued" else ""
    y = arrow.y
    if arrow.loop:
        # Out of the lane's middle and back into it, under the label.
        x = arrow.x1 + 6
        out = x + wl.LOOP_W
        path = f"M{num(x)},{num(y - 1)} C{num(out)},{num(y - 3)} {num(out)},{num(y + 12)} {num(x)},{num(y + 10)}"
        head = _arrow_role(x, y + 10, out, y + 12, stroke, role)
        label_x, anchor, note_y = arrow.x1, "middle", y + 25
    else:
        toward = 1 if arrow.x2 > arrow.x1 else -1
        end = arrow.x2 - toward * 6
        path = f"M{num(arrow.x1)},{num(y)} L{num(end)},{num(y)}"
        head = _arrow_role(end, y, arrow.x1, y, stroke, role)
        label_x, anchor, note_y = (arrow.x1 + arrow.x2) / 2, "middle", y + 13
    state = call.get("state", "")
    label = f"{call['function']} \u00b7 {state}"
    site = call.get("site")
    blocked = call.get("blocked_at")
    note = f"blocked on a {blocked['what']}" if blocked else (f"from {site}" if site else "")
    related = esc(" ".join(dict.fromkeys([call["caller"], call["callee"]])))
    return (f'<g class="nbrpc-call nbrpc-node" data-id="{esc(call["id"])}" data-workers="{related}" '
            f'data-state="{esc(state)}" data-alarm="{"true" if arrow.alarm else "false"}">'
            f'<path class="{role}" d="{path}" fill="none" stroke="{stroke}" stroke-width="1.8"{dash}/>{head}'
            f'<text class="{ink_role}" x="{num(label_x)}" y="{num(y - 6)}" text-anchor="{anchor}" '
            f'fill="{ink}">{esc(clip(label, 34))}</text>'
            + (f'<text class="{"nbrpc-alarm" if arrow.alarm else "nbrpc-muted"}" x="{num(label_x)}" '
               f'y="{num(note_y)}" text-anchor="{anchor}" font-size="10" '
               f'fill="{ALARM if arrow.alarm else MUTED}">{esc(clip(note, 38))}</text>' if note else "")
            + f"{title(details)}</g>")


def _arrow_role(x: float, y: float, from_x: float, from_y: float, fill: str, role: str) -> str:
    return _arrow(x, y, from_x, from_y, fill).replace("<polygon ", f'<polygon class="{role}" ', 1)


def _link(waiting: wl.Arrow, waited: wl.Arrow) -> str:
    """From the end of a served call down to the start of a call its thread made."""
    x1, y1 = waiting.x2, waiting.y + 3
    x2, y2 = waited.x1, waited.y - 3
    return (f'<path class="nbrpc-waits-on nbrpc-line" data-from="{esc(waiting.call["id"])}" '
            f'data-to="{esc(waited.call["id"])}" d="M{num(x1)},{num(y1)} L{num(x2)},{num(y2)}" '
            f'stroke="{MUTED}" stroke-width="1" stroke-dasharray="2 3"/>')


def waits_details(snapshot: dict) -> dict:
    """Hover details of each call: ``{call id: {title, rows}}``."""
    out = {}
    for call in snapshot.get("calls", []):
        rows = [["from", call["caller"]], ["to", call["callee"]], ["state", call.get("state", "")]]
        if call.get("site"):
            rows.append(["call site", call["site"]])
        if call.get("at"):
            rows.append(["running at", str(call["at"])])
        blocked = call.get("blocked_at")
        if blocked:
            file = str(blocked.get("file", "")).rsplit("/", 1)[-1]
            where = blocked.get("cell") or f"{file}, line {blocked.get('line')}"
            code = f" at `{blocked['code']}`" if blocked.get("code") else ""
            rows.append(["blocked", f"on a {blocked['what']}{code} ({where})"])
        if call.get("waits_on"):
            rows.append(["waits on", ", ".join(call["waits_on"])])
        if call.get("thread") is not None:
            rows.append(["thread", str(call["thread"])])
        out[call["id"]] = {"title": f"{call['function']} on {call['callee']}", "rows": rows}
    return out


def waits_summary(snapshot: dict) -> str:
    """One line: how many calls are pending and which hangs are found."""
    calls, found = snapshot.get("calls", []), snapshot.get("findings", [])
    if not calls and not found:
        return "no call is pending"
    text = f"{len(calls)} pending call{'s' * (len(calls) != 1)}"
    if found:
        kinds = ", ".join(dict.fromkeys(f["kind"] for f in found))
        text += f"; stuck: {kinds}"
    return text


def static_html(snapshot: dict) -> str:
    """The ``text/html`` fallback: the drawing, themed where JupyterLab's variables are,
    fitted to the output's width, and the summary under it."""
    return (f'<div class="nbrpc-graph-static nbrpc-fit" style="max-width:100%;overflow:auto">'
            f"{theme_style()}"
            f"{waits_svg(snapshot)}"
            f'<div style="font-size:11px;color:var(--jp-ui-font-color1,{MUTED})">'
            f"{esc(waits_summary(snapshot))}</div></div>")
