"""The RPC timeline drawn: one deterministic SVG, hover details and the summary.

``timeline_svg`` turns ``timeline_layout``'s positions into the SVG that the widget
shows, that static viewers keep and that ``write_report`` puts in its page. As in
``svg.py``, numbers are rounded, items come in layout order and nothing carries a
per-process id. The plot is a nested ``<svg class="nbrpc-tl-plot">`` whose viewport
clips the bars; the front end zooms by changing its ``viewBox`` (lines keep their
width through ``vector-effect``) and redraws the axis (``nbrpc-tl-axis``) from the
root's ``data-t0`` and ``data-t1`` (seconds from ``data-origin``, the snapshot's
start). Interactive items carry:

- ``data-id`` on each call's bar (the call id, the keys of ``call_details``) or busy
  interval (``busy:<lane>:<k>``), and ``data-call`` on a call's lines;
- ``data-lane`` on each lane, ``data-workers`` on bars (the caller and callee);
- class ``nbrpc-tl-waiting``: pale marks over the parts of bars spent waiting on
  calls they made themselves (an ``rref.to_here()`` inside a call).
"""

from __future__ import annotations

from . import summary
from . import timeline_layout as tl
from .describe import size_text
from .svg import FONT, INK, MUTED, box, clip, esc, num, theme_style, title

SEND, REPLY, WAIT = "#555555", "#999999", "#b8b8b8"
LANE_FILLS = ("#f6f7f9", "#ffffff")
GROUNDS = ("nbrpc-ground-alt", "nbrpc-ground")  # the lanes' theme roles (svg.THEME_CSS)
LINE_ROLES = {"wait": "nbrpc-faint", "send": "nbrpc-line", "reply": "nbrpc-faint"}
LEGEND_NAMES = 8
LEGEND_CHARS = 30


def duration(seconds: float | None) -> str:
    """``850 µs``, ``12.3 ms``, ``1.25 s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.0f} \u00b5s"
    if abs(seconds) < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _bytes_text(part: dict | None) -> str:
    if not part:
        return "-"
    tensor, pickle = int(part.get("tensor") or 0), int(part.get("pickle") or 0)
    return f"{size_text(tensor + pickle)} ({size_text(tensor)} tensors, {size_text(pickle)} pickle)"


def call_details(snapshot: dict) -> dict[str, dict]:
    """Hover details of every call, by id: ``{"title", "rows"}`` with string values."""
    origin = snapshot.get("start", 0.0)

    def at(t):
        return "-" if t is None else f"+{duration(t - origin)}"

    details = {}
    nested = tl.nested_waits(snapshot.get("calls", []))
    for c in snapshot.get("calls", []):
        began, ended, sent, replied = c.get("began"), c.get("ended"), c["sent"], c.get("replied")
        rows = [
            ["function", c.get("name") or "?"],
            ["kind", c.get("kind") or "?"],
            ["caller \u2192 callee", f"{c.get('caller')} \u2192 {c.get('callee')}"],
            ["thread", c.get("thread") or "-"],
            ["sent", at(sent)], ["began", at(began)], ["ended", at(ended)], ["replied", at(replied)],
            ["ran for", duration(ended - began) if began is not None and ended is not None else "-"],
            ["queueing delay", duration(began - sent) if began is not None else "-"],
            ["waited on its own calls", duration(sum(min(b, ended) - max(a, began) for a, b in nested[c["id"]]
                                                      if began is not None and ended is not None
                                                      and min(b, ended) > max(a, began)))
             if c["id"] in nested else "-"],
            ["round trip", duration(replied - sent) if replied is not None else "-"],
            ["request", _bytes_text(c.get("request"))],
            ["reply", _bytes_text(c.get("reply"))],
        ]
        for label, key in (("context", "context"), ("RRef", "rref"), ("inside call", "parent"),
                           ("error", "error")):
            if c.get(key) is not None:
                rows.append([label, str(c[key])])
        if began is None:
            rows.append(["note", "the callee's part was not recorded"])
        elif ended is None:
            rows.append(["note", "still running when this was recorded"])
        details[c["id"]] = {"title": f"{c.get('name') or '?'} on {c.get('callee')}", "rows": rows}
    return details


def busy_details(place: tl.TimelineLayout) -> dict[str, dict]:
    """Hover details of an aggregated view's busy intervals."""
    out = {}
    for bar in place.bars:
        a = place.t0 + bar.x / place.plot_w * (place.t1 - place.t0)
        length = bar.width / place.plot_w * (place.t1 - place.t0)
        out[bar.id] = {"title": f"{place.lanes[bar.lane].label}: busy {bar.share:.0%}", "rows": [
            ["busy", f"{bar.share:.0%} of the time (in 5% steps)"], ["calls begun", str(bar.count)],
            ["from", f"+{duration(a - place.origin)}"], ["for", duration(length)]]}
    return out


def headline(snapshot: dict, place: tl.TimelineLayout | None = None) -> str:
    """One line: calls, members, window, busy time per member, clock bound, drops."""
    calls = snapshot.get("calls", [])
    names = tl.members(snapshot)
    t0, t1 = tl.span(snapshot)
    busy = ", ".join(f"{m} {duration(tl.busy_time(tl.busy_intervals(snapshot, m)))}"
                     for m in names if tl.busy_intervals(snapshot, m))
    line = (f"RPC timeline: {len(calls)} call{'s' * (len(calls) != 1)} on {len(names)} "
            f"member{'s' * (len(names) != 1)} over {duration(t1 - t0)}")
    if busy:
        line += f"; busy: {busy}"
    bound, worst = tl.clock_bound(snapshot)
    if bound > 0:
        line += f"; clocks aligned within \u00b1{duration(bound)} ({', '.join(worst)})"
    if snapshot.get("dropped"):
        line += f"; {snapshot['dropped']} records dropped"
    if place is not None and place.aggregated:
        line += f"; aggregated: {len(calls):,} calls drawn as each lane's busy intervals"
    return line


# "wall": the time during which one of the row's calls was under way (overlaps once);
# "summed": their times added up (ten overlapping 1 s calls: wall 1 s, summed 10 s).
STAT_COLUMNS = ("function", "callee", "calls", "wall", "summed", "median", "queue", "bytes", "errors")
STAT_HELP = {"wall": "time during which at least one of these calls was under way",
             "summed": "the calls' times added up; overlapping calls each count"}


def stat_cells(row: dict) -> list[str]:
    known = row["median"] is not None
    return [row["name"], row["callee"], str(row["count"]), duration(row.get("wall") if known else None),
            duration(row["total"] if known else None), duration(row["median"]),
            duration(row["queue"]), size_text(row["bytes"]), str(row["errors"])]


def summary_text(snapshot: dict, place: tl.TimelineLayout | None = None, limit: int = 20) -> str:
    """``text/plain``: the headline, then the table per function and callee."""
    rows = summary.summarize(snapshot)
    table = [list(STAT_COLUMNS)] + [stat_cells(r) for r in rows[:limit]]
    widths = [max(len(r[i]) for r in table) for i in range(len(STAT_COLUMNS))]
    lines = [headline(snapshot, place)]
    for r in table:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(r, widths))).rstrip())
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more")
    return "\n".join(lines)


def summary_html(snapshot: dict, limit: int = 50) -> str:
    """The table per function and callee, as HTML (under the widget and in reports)."""
    rows = summary.summarize(snapshot)
    head = "".join(f'<th style="padding:1px 8px 1px 0;text-align:left"'
                   f'{f" title={chr(34)}{esc(STAT_HELP[c])}{chr(34)}" if c in STAT_HELP else ""}>{c}</th>'
                   for c in STAT_COLUMNS)
    body = []
    for r in rows[:limit]:
        cells = stat_cells(r)
        swatch = (f'<span style="display:inline-block;width:9px;height:9px;margin-right:4px;'
                  f'background:{tl.colour(r["name"])}"></span>')
        body.append("<tr>" + f'<td style="padding:1px 8px 1px 0">{swatch}{esc(cells[0])}</td>' + "".join(
            f'<td style="padding:1px 8px 1px 0">{esc(c)}</td>' if i == 0
            else f'<td style="padding:1px 8px 1px 0;text-align:right">{esc(c)}</td>'
            for i, c in enumerate(cells[1:])) + "</tr>")
    more = f'<div>\u2026 and {len(rows) - limit} more</div>' if len(rows) > limit else ""
    return (f'<table class="nbrpc-tl-table" style="border-collapse:collapse;font-size:11px">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}')


def timeline_svg(snapshot: dict, *, threads: bool = False, aggregate_above: int | None = tl.AGGREGATE_ABOVE,
                 titles: bool = True, plot_w: float = tl.PLOT_W) -> str:
    """The timeline as SVG; ``titles`` adds ``<title>`` tooltips (static viewers)."""
    place = tl.timeline_layout(snapshot, threads=threads, aggregate_above=aggregate_above, plot_w=plot_w)
    return draw(snapshot, place, titles)


def draw(snapshot: dict, place: tl.TimelineLayout, titles: bool = True) -> str:
    details = (busy_details(place) if place.aggregated else call_details(snapshot)) if titles else {}
    calls = {c["id"]: c for c in snapshot.get("calls", [])}
    w, h = place.width, place.height
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="nbrpc-svg nbrpc-timeline" data-kind="timeline" '
             f'{box(w, h)} {FONT} '
             f'data-origin="{place.origin:.6f}" data-t0="{place.t0 - place.origin:.6f}" '
             f'data-t1="{place.t1 - place.origin:.6f}" '
             f'data-plot-x="{num(place.plot_x)}" data-plot-y="{num(place.plot_y)}" '
             f'data-plot-w="{num(place.plot_w)}" data-plot-h="{num(place.plot_h)}">',
             f'<text class="nbrpc-tl-title nbrpc-ink" x="{tl.MARGIN}" y="{tl.MARGIN + 12}" fill="{INK}">'
             f'{esc(clip(headline(snapshot, place), 150))}</text>']
    parts.append('<g class="nbrpc-tl-lanes">')
    for lane in place.lanes.values():
        bold = ' font-weight="bold"' if lane.thread is None else ""
        parts.append(f'<g class="nbrpc-lane" data-lane="{esc(lane.key)}" data-workers="{esc(lane.member)}">'
                     f'<rect x="{tl.MARGIN}" y="{num(lane.y)}" width="{num(tl.LABEL_W + place.plot_w)}" '
                     f'height="{num(lane.height)}" class="{GROUNDS[lane.index % 2]} nbrpc-rule" '
                     f'fill="{LANE_FILLS[lane.index % 2]}" stroke="#e3e5e8" stroke-width="0.5"/>'
                     f'<text class="nbrpc-ink" x="{tl.MARGIN + 6}" y="{num(lane.y + lane.height / 2 + 4)}" '
                     f'fill="{INK}"'
                     f'{bold}>{esc(clip(lane.label, 24))}</text></g>')
    parts += ["</g>", _axis(place), *_plot(place, calls, details), _legend(place, titles), "</svg>"]
    return "".join(parts)


def _plot(place: tl.TimelineLayout, calls: dict, details: dict) -> list[str]:
    """The nested SVG that clips and zooms: lines, bars, the pale marks of waits."""
    parts = [f'<svg class="nbrpc-tl-plot" x="{num(place.plot_x)}" y="{num(place.plot_y)}" '
             f'width="{num(place.plot_w)}" height="{num(place.plot_h)}" '
             f'viewBox="0 0 {num(place.plot_w)} {num(place.plot_h)}" preserveAspectRatio="none">']
    py = place.plot_y
    lines = {"wait": [], "send": [], "reply": []}
    for s in place.segments:
        lines[s.kind].append(f'<line data-call="{esc(s.id)}" x1="{num(s.x1)}" y1="{num(s.y1 - py)}" '
                             f'x2="{num(s.x2)}" y2="{num(s.y2 - py)}"/>')
    # Hundreds of lines are a grey fog: the more calls, the fainter each line.
    faint = num(max(0.2, min(1.0, 60 / max(len(lines["send"]), 1))))
    for kind, stroke, width in (("wait", WAIT, 1.5), ("send", SEND, 0.8), ("reply", REPLY, 0.8)):
        if lines[kind]:
            opacity = "" if kind == "wait" or faint == "1" else f' stroke-opacity="{faint}"'
            parts.append(f'<g class="nbrpc-tl-{kind} {LINE_ROLES[kind]}" stroke="{stroke}" '
                         f'stroke-width="{width}"{opacity} '
                         f'vector-effect="non-scaling-stroke">{"".join(lines[kind])}</g>')
    parts.append('<g class="nbrpc-tl-bars nbrpc-cut" stroke="#ffffff" stroke-width="0.5">')
    for bar in place.bars:
        call = calls.get(bar.id, {})
        related = " ".join(dict.fromkeys(x for x in (call.get("caller"), place.lanes[bar.lane].member) if x))
        stroke = ' stroke="#c0392b" stroke-width="1.5"' if bar.failed else ""
        if bar.running:  # in flight: pale, outlined, open to the right
            stroke += ' fill-opacity="0.55" stroke-dasharray="3 2"'
        cls = "nbrpc-tl-bar nbrpc-tl-running" if bar.running else "nbrpc-tl-bar"
        parts.append(f'<rect class="{cls}" data-id="{esc(bar.id)}" data-workers="{esc(related)}" '
                     f'x="{bar.x:.2f}" y="{num(bar.y - py)}" width="{bar.width:.2f}" height="{num(bar.height)}" '
                     f'fill="{bar.fill}"{stroke}>{title(details.get(bar.id))}</rect>')
    parts.append("</g>")
    waits = [f'<rect x="{x:.2f}" y="{num(bar.y - py + 2)}" width="{w:.2f}" height="{tl.ROW_H - 4}"/>'
             for bar in place.bars for x, w in bar.waits]
    if waits:
        # A call's own calls (a to_here inside it): it waited there, it did not work.
        parts.append(f'<g class="nbrpc-tl-waiting nbrpc-veil" fill="#ffffff" fill-opacity="0.65" '
                     f'pointer-events="none">{"".join(waits)}</g>')
    parts.append("</svg>")
    return parts


def _axis(place: tl.TimelineLayout) -> str:
    """Grid lines over the lanes and labelled ticks under them (the front end redraws it)."""
    top, bottom = place.plot_y, place.plot_y + place.plot_h
    parts = [f'<g class="nbrpc-tl-axis nbrpc-tick" font-size="10" fill="{MUTED}">',
             f'<line class="nbrpc-line" x1="{num(place.plot_x)}" y1="{num(bottom)}" '
             f'x2="{num(place.plot_x + place.plot_w)}" y2="{num(bottom)}" stroke="{MUTED}" stroke-width="0.8"/>']
    a, b = place.t0 - place.origin, place.t1 - place.origin
    for t, label in tl.ticks(a, b):
        x = place.plot_x + (t - a) / (b - a) * place.plot_w
        parts.append(f'<line class="nbrpc-rule" x1="{num(x)}" y1="{num(top)}" x2="{num(x)}" '
                     f'y2="{num(bottom + 4)}" stroke="#d0d4d9" stroke-width="0.6"/>'
                     f'<text class="nbrpc-tl-tick" x="{num(x)}" y="{num(bottom + 15)}" '
                     f'text-anchor="middle">{esc(label)}</text>')
    parts.append("</g>")
    return "".join(parts)


def _legend(place: tl.TimelineLayout, titles: bool = True) -> str:
    y = place.plot_y + place.plot_h + tl.AXIS_H + 4
    parts = [f'<g class="nbrpc-tl-legend nbrpc-ink" font-size="10" fill="{INK}">']
    if place.aggregated:
        parts.append(f'<rect x="{num(place.plot_x)}" y="{num(y)}" width="10" height="10" fill="{tl.BUSY}"/>'
                     f'<text x="{num(place.plot_x + 14)}" y="{num(y + 9)}">share of the time busy: '
                     f'{place.calls:,} calls, aggregated (hover for calls and shares)</text>')
        return "".join(parts) + "</g>"
    x = place.plot_x
    names = place.names[:LEGEND_NAMES]
    for name, label in zip(names, legend_labels(names)):
        width = 24 + 6 * len(label)
        if x + width > place.plot_x + place.plot_w + tl.RIGHT_PAD:
            break
        parts.append(f'<rect x="{num(x)}" y="{num(y)}" width="10" height="10" fill="{tl.colour(name)}"/>'
                     f'<text x="{num(x + 14)}" y="{num(y + 9)}">{esc(label)}'
                     f'{f"<title>{esc(name)}</title>" if titles and label != name else ""}</text>')
        x += width
    parts.append("</g>")
    return "".join(parts)


def legend_labels(names: list[str], chars: int = LEGEND_CHARS) -> list[str]:
    """Labels of at most ``chars`` characters, one per name and all different: a long
    name keeps its start and its end, the method whole where it fits
    (``BatchUp….update_and_fetch_model``), where methods of one class differ; names that
    still clash get a number."""
    labels = []
    for name in names:
        if len(name) <= chars:
            labels.append(name)
        else:  # the method whole where it fits, as much of the class as is left
            method = "." + name.rsplit(".", 1)[1] if "." in name else ""
            tail = len(method) if 0 < len(method) <= chars - 6 else chars - 1 - chars // 3
            labels.append(name[:chars - 1 - tail] + "\u2026" + name[-tail:])
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def static_html(snapshot: dict, drawing: str, place: tl.TimelineLayout | None = None) -> str:
    """``text/html``: the SVG fitted to the output's width (themed where JupyterLab's
    variables are), the headline and the table under it."""
    return (f'<div class="nbrpc-timeline-static nbrpc-fit" style="max-width:100%;overflow:auto">'
            f'{theme_style()}{drawing}'
            f'<div style="font-size:11px;color:var(--jp-ui-font-color1,{MUTED});margin:4px 0">'
            f'{esc(headline(snapshot, place))}</div>{summary_html(snapshot)}</div>')

