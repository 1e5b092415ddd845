"""Positions to SVG: the one drawing that the widget shows and static viewers keep.

The output is deterministic: numbers rounded to one decimal, items in layout order,
no random or per-process ids (so two displays of the same graph on a page never
clash, and an executed notebook's stored output does not change between runs).
Colours are presentation attributes, not CSS, so GitHub and nbviewer draw it right;
each themed item also carries a role class (``nbrpc-ink``, ``nbrpc-muted``,
``nbrpc-line``, ``nbrpc-rule``, ``nbrpc-ground``...) that ``THEME_CSS`` maps to
JupyterLab's CSS variables, so a page that has them (light, dark, high contrast)
overrides the attributes, and one that has not keeps them: every text colour reads at
4.5:1 or more against what it sits on, in either case. Interactive items carry
``data-*`` attributes that the front end uses:

- ``data-id`` on every hoverable item (an RRef id, ``@owner`` for an aggregated
  owner node, an autograd function id), matching the keys of the details JSON;
- ``data-workers``: the workers an item concerns (space-separated), for the filter;
- ``data-lane`` on each worker's lane;
- class ``nbrpc-fork`` on fork-history arcs, ``nbrpc-rpc`` on autograd rpc edges.
"""

from __future__ import annotations

import collections
import html
import math

from . import describe, layout
from .layout import AGG_R, FN_H, FN_W, FORK_BAND, HEADER_H, NODE_R, Layout

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
           "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
INK, MUTED, RPC = "#333333", "#595959", "#7b3294"
FONT = 'font-family="-apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="11"'
# Role classes -> JupyterLab's theme variables; the fallbacks are the attributes' colours.
# A CSS rule beats a presentation attribute, so where the variables exist they win.
THEME_CSS = (
    ".nbrpc-svg .nbrpc-ink{fill:var(--jp-ui-font-color1,#333)}"
    ".nbrpc-svg .nbrpc-muted{fill:var(--jp-ui-font-color1,#595959)}"
    ".nbrpc-svg .nbrpc-line{stroke:var(--jp-ui-font-color2,#595959)}"
    ".nbrpc-svg .nbrpc-faint{stroke:var(--jp-ui-font-color3,#999)}"
    ".nbrpc-svg .nbrpc-edge{stroke:var(--jp-ui-font-color1,#333)}"
    ".nbrpc-svg .nbrpc-rule{stroke:var(--jp-border-color2,#e0e0e0)}"
    ".nbrpc-svg .nbrpc-ground{fill:var(--jp-layout-color0,#fff)}"
    ".nbrpc-svg .nbrpc-ground-alt{fill:var(--jp-layout-color1,#f6f7f9)}"
    ".nbrpc-svg .nbrpc-cut{stroke:var(--jp-layout-color0,#fff)}"
    ".nbrpc-svg .nbrpc-veil{fill:var(--jp-layout-color0,#fff)}"
    ".nbrpc-svg .nbrpc-tick{fill:var(--jp-ui-font-color2,#595959)}"
    # stuck calls and their findings in the wait-for graph
    ".nbrpc-svg text.nbrpc-alarm,.nbrpc-svg polygon.nbrpc-alarm{fill:var(--jp-error-color1,#b71c1c)}"
    ".nbrpc-svg path.nbrpc-alarm,.nbrpc-svg line.nbrpc-alarm,.nbrpc-svg rect.nbrpc-alarm"
    "{stroke:var(--jp-error-color1,#b71c1c)}"
)


def num(value: float) -> str:
    """Fixed rounding: one decimal, no trailing ``.0``, no ``-0``."""
    text = f"{round(float(value), 1):.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def luminance(hex_colour: str) -> float:
    """WCAG relative luminance of ``#rrggbb``."""
    channels = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours (1 to 21)."""
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_on(fill: str) -> str:
    """Black or white, whichever reads better on ``fill``."""
    return "#000000" if contrast("#000000", fill) >= contrast("#ffffff", fill) else "#ffffff"


def weight(count: int) -> float:
    """Stroke width for an edge that stands for ``count`` items: grows slowly, capped."""
    return min(4.0, 1 + 0.5 * math.log2(max(count, 1)))


def clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "\u2026"


def title(details: dict | None) -> str:
    """A ``<title>`` child: the native tooltip of static viewers."""
    if details is None:
        return ""
    lines = [details["title"], *(f"{k}: {v}" for k, v in details["rows"])]
    return f"<title>{esc(chr(10).join(lines))}</title>"


# The smallest font-size any drawing uses, and the smallest a page may show it at: a
# drawing fitted to a narrow output shrinks no further than that, and scrolls instead.
SMALLEST_TEXT = 10
READABLE_TEXT = 9


def box(width: float, height: float) -> str:
    """A root ``<svg>``'s size attributes: its size, its viewBox, and a ``min-width``
    that keeps its smallest text at ``READABLE_TEXT`` px however narrow the page is."""
    narrowest = math.ceil(width * READABLE_TEXT / SMALLEST_TEXT)
    return (f'width="{num(width)}" height="{num(height)}" viewBox="0 0 {num(width)} {num(height)}" '
            f'style="min-width:{narrowest}px"')


def _open(width: float, height: float, kind: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="nbrpc-svg" data-kind="{kind}" '
            f'{box(width, height)} {FONT}>')


def theme_style() -> str:
    """A ``<style>`` that themes the drawings on a page with JupyterLab's variables and
    lets a drawing shrink to the width it has (static HTML, the report)."""
    return (f"<style>{THEME_CSS}.nbrpc-fit svg.nbrpc-svg{{max-width:100%;height:auto}}"
            ".nbrpc-fit .nbrpc-tl-plot{max-width:none}</style>")


def _arrow(x: float, y: float, from_x: float, from_y: float, fill: str, size: float = 6,
           role: str = "") -> str:
    """A triangle pointing at (x, y), coming from (from_x, from_y); no markers, no ids."""
    angle = math.atan2(y - from_y, x - from_x)
    spread = 0.45
    points = [(x, y)]
    for side in (-spread, spread):
        points.append((x - size * math.cos(angle + side), y - size * math.sin(angle + side)))
    cls = f' class="{role}"' if role else ""
    return f'<polygon{cls} points="{" ".join(f"{num(a)},{num(b)}" for a, b in points)}" fill="{fill}"/>'


def _lane(lane: layout.Lane, lines: list[str], fill: str) -> str:
    chars = layout.label_chars(lane.width)
    head = (f'<text class="nbrpc-ink" x="{num(lane.center)}" y="{num(lane.y + 16)}" text-anchor="middle" '
            f'font-weight="bold" fill="{INK}">{esc(clip(lane.worker, chars))}</text>')
    sub = "".join(
        f'<text class="nbrpc-muted" x="{num(lane.center)}" y="{num(lane.y + 29 + 11 * i)}" '
        f'text-anchor="middle" font-size="10" fill="{MUTED}">{esc(clip(line, chars + 2))}</text>'
        for i, line in enumerate(lines))
    return (f'<g class="nbrpc-lane" data-lane="{esc(lane.worker)}" data-workers="{esc(lane.worker)}">'
            f'<rect x="{num(lane.x)}" y="{num(lane.y)}" width="{num(lane.width)}" '
            f'height="{num(lane.height)}" rx="6" fill="{fill}" fill-opacity="0.05" stroke="{fill}" '
            f'stroke-opacity="0.4"/>'
            f'<rect x="{num(lane.x)}" y="{num(lane.y)}" width="{num(lane.width)}" height="{HEADER_H}" '
            f'rx="6" fill="{fill}" fill-opacity="0.2"/>{head}{sub}</g>')


# -- RRef graph ----------------------------------------------------------------------


def rref_svg(snapshot: dict, *, show_forks: bool = True, worker: str | None = None,
             aggregate_above: int | None = None, bundle_above: int | None = None,
             titles: bool = True) -> str:
    """The RRef ownership graph as SVG.

    Parameters
    ----------
    show_forks
        Draw fork history: one arc per (sender, receiver) pair of workers, its
        width growing with the number of forks, in a band above the lanes.
    worker
        Keep only RRefs this worker owns or holds (and their edges).
    aggregate_above
        Above this many RRefs draw one node per owner with counts instead.
    bundle_above
        Above this many RRefs draw one edge per (owner, holder) pair, its width
        growing with the count; each RRef's own edges are still there, hidden
        (``display="none"``, class ``nbrpc-quiet``) until the front end lights them
        on hover or pin. A thousand long translucent curves cost more to paint
        than the rest of the graph, and show nothing but a tangle.
    titles
        Add ``<title>`` tooltips (static viewers); the widget shows its own.
    """
    if worker:
        snapshot = dict(snapshot, rrefs=[
            r for r in snapshot.get("rrefs", [])
            if r.get("owner") == worker or worker in (r.get("holders") or [])])
    aggregate = aggregate_above is not None and len(snapshot.get("rrefs", [])) > aggregate_above
    places = layout.rref_layout(snapshot, aggregate=aggregate, forks=show_forks)
    colours = {name: colour(lane.index) for name, lane in places.lanes.items()}
    workers = {w["name"]: w for w in snapshot.get("workers", [])}
    owned = layout.rref_order(snapshot)
    parts = [_open(places.width, places.height, "rref"), '<g class="nbrpc-lanes">']
    for name, lane in places.lanes.items():
        info = workers.get(name, {})
        first = " \u00b7 ".join(x for x in (
            f"rank {info['id']}" if info.get("id") is not None else "",
            f"pid {info['pid']}" if info.get("pid") is not None else "") if x) or "not a member"
        count = len(owned.get(name, []))
        parts.append(_lane(lane, [first, f"owns {count} RRef{'s' * (count != 1)}"], colours[name]))
    parts.append("</g>")
    if show_forks:
        parts.append(_fork_arcs(snapshot, places))
    if aggregate:
        parts += _aggregated(snapshot, places, colours, titles)
    else:
        quiet = bundle_above is not None and len(snapshot.get("rrefs", [])) > bundle_above
        parts += _rrefs(snapshot, places, colours, titles, quiet)
    parts.append("</svg>")
    return "".join(parts)


def _hold_path(x: float, y: float, lane: layout.Lane) -> str:
    hx, hy = lane.center, lane.header_bottom
    bend = max(18.0, (y - hy) / 2)
    return f"M{num(x)},{num(y)} C{num(x)},{num(y - bend)} {num(hx)},{num(hy + bend)} {num(hx)},{num(hy)}"


def _bundle(owner: str, holder: str, count: int, places: Layout, stroke: str) -> str:
    a, b = places.lanes[owner], places.lanes[holder]
    (x1, y1), (x2, y2) = (a.center + 6, a.header_bottom), (b.center - 6, b.header_bottom)
    dip = 30 + 6 * abs(a.index - b.index)
    return (f'<g class="nbrpc-bundle" data-workers="{esc(owner)} {esc(holder)}">'
            f'<path d="M{num(x1)},{num(y1)} C{num(x1)},{num(y1 + dip)} {num(x2)},{num(y2 + dip)} '
            f'{num(x2)},{num(y2)}" stroke="{stroke}" stroke-opacity="0.7" '
            f'stroke-width="{num(weight(count))}"/><title>{count} RRef{"s" * (count != 1)} owned by '
            f'{esc(owner)} held by {esc(holder)}</title></g>')


def _rrefs(snapshot: dict, places: Layout, colours: dict, titles: bool, quiet: bool = False) -> list[str]:
    details = describe.rref_details(snapshot) if titles else {}
    pairs: collections.Counter = collections.Counter()
    hold_class = "nbrpc-hold nbrpc-quiet" if quiet else "nbrpc-hold"
    hidden = ' display="none"' if quiet else ""
    # Shared attributes sit on the groups: a thousand RRefs make a smaller page.
    edges = ['<g class="nbrpc-edges" fill="none" stroke-opacity="0.35">']
    nodes = [f'<g class="nbrpc-nodes nbrpc-edge" stroke="{INK}" stroke-width="0.8">']
    for r in sorted(snapshot.get("rrefs", []), key=lambda r: layout.natural_key(r["id"])):
        x, y = places.positions[r["id"]]
        owner, holders = r["owner"], list(dict.fromkeys(r.get("holders") or []))
        related = esc(" ".join(dict.fromkeys([owner, *holders])))
        fill = colours[owner]
        for h in holders:
            if h != owner:
                pairs[(owner, h)] += 1
                edges.append(f'<path class="{hold_class}" data-rref="{esc(r["id"])}" '
                             f'data-workers="{esc(owner)} {esc(h)}" d="{_hold_path(x, y, places.lanes[h])}" '
                             f'stroke="{fill}"{hidden}/>')
        hollow = "" if r.get("confirmed") else ' fill-opacity="0.25" stroke-dasharray="2 2"'
        nodes.append(f'<circle class="nbrpc-node" data-id="{esc(r["id"])}" data-workers="{related}" '
                     f'cx="{num(x)}" cy="{num(y)}" r="{NODE_R}" fill="{fill}"{hollow}>'
                     f'{title(details.get(r["id"]))}</circle>')
    if quiet:
        order = sorted(pairs, key=lambda p: (places.lanes[p[0]].index, places.lanes[p[1]].index))
        edges += [_bundle(o, h, pairs[(o, h)], places, colours[o]) for o, h in order]
    return [*edges, "</g>", *nodes, "</g>"]


def _aggregated(snapshot: dict, places: Layout, colours: dict, titles: bool) -> list[str]:
    details = describe.owner_details(snapshot) if titles else {}
    edges, nodes = ['<g class="nbrpc-edges" fill="none">'], ['<g class="nbrpc-nodes">']
    for owner, owned in layout.rref_order(snapshot).items():
        x, y = places.positions[owner]
        holders = collections.Counter(h for r in owned for h in dict.fromkeys(r.get("holders") or []))
        for h in sorted(holders, key=lambda h: places.lanes[h].index):
            if h == owner:
                continue
            lane = places.lanes[h]
            edges.append(f'<path class="nbrpc-hold" data-rref="@{esc(owner)}" '
                         f'data-workers="{esc(owner)} {esc(h)}" d="{_hold_path(x, y, lane)}" '
                         f'stroke="{colours[owner]}" stroke-opacity="0.6" '
                         f'stroke-width="{num(weight(holders[h]))}"/>')
        related = esc(" ".join(dict.fromkeys([owner, *sorted(holders, key=layout.natural_key)])))
        nodes.append(f'<g class="nbrpc-node" data-id="@{esc(owner)}" data-workers="{related}">'
                     f'<circle class="nbrpc-edge" cx="{num(x)}" cy="{num(y)}" r="{AGG_R}" '
                     f'fill="{colours[owner]}" stroke="{INK}" stroke-width="0.8"/>'
                     f'<text x="{num(x)}" y="{num(y + 4)}" text-anchor="middle" font-weight="bold" '
                     f'fill="{text_on(colours[owner])}">{len(owned)}</text>{title(details.get(owner))}</g>')
    return [*edges, "</g>", *nodes, "</g>"]


FORK_LIFT = 12  # how much higher a leftward fork arc rises than the rightward one


def _fork_arcs(snapshot: dict, places: Layout) -> str:
    pairs = collections.Counter(
        (e.get("from"), e.get("to")) for e in snapshot.get("events", [])
        if e.get("kind") == "fork" and e.get("from") in places.lanes and e.get("to") in places.lanes
        and e.get("from") != e.get("to"))
    parts = ['<g class="nbrpc-forks" fill="none">']
    for (src, dst), count in sorted(pairs.items(), key=lambda kv: (places.lanes[kv[0][0]].index,
                                                                     places.lanes[kv[0][1]].index)):
        a, b = places.lanes[src], places.lanes[dst]
        # Arcs leave from the left half of a header and land on the right half of the
        # other, so a -> b and b -> a do not overlap.
        x1, x2 = a.center - 12, b.center + 12
        top = a.y
        # a -> b and b -> a share a midpoint: the leftward arc rises higher, so their
        # counts sit one above the other, not on top of each other.
        back = FORK_LIFT if a.index > b.index else 0
        rise = min(FORK_BAND - 6 - FORK_LIFT, 8 + 5 * abs(a.index - b.index)) + back
        cx, cy = (x1 + x2) / 2, top - 2 * rise  # the arc's apex is at top - rise
        label = f"{count} fork{'s' * (count != 1)} {src} \u2192 {dst}"
        parts.append(f'<g class="nbrpc-fork" data-workers="{esc(src)} {esc(dst)}">'
                     f'<path d="M{num(x1)},{num(top)} Q{num(cx)},{num(cy)} {num(x2)},{num(top)}" '
                     f'class="nbrpc-line" stroke="{MUTED}" stroke-dasharray="4 3" '
                     f'stroke-width="{num(weight(count))}"/>'
                     f'{_arrow(x2, top, cx, cy, MUTED, role="nbrpc-tick")}'
                     f'<text class="nbrpc-tick" x="{num(cx)}" y="{num(top - rise - 3)}" text-anchor="middle" '
                     f'font-size="10" fill="{MUTED}">{count}</text><title>{esc(label)}</title></g>')
    parts.append("</g>")
    return "".join(parts)


# -- autograd graph ------------------------------------------------------------------


def autograd_svg(snapshot: dict, *, titles: bool = True) -> str:
    """The distributed autograd graph as SVG: a layered DAG per worker lane, the loss on
    top; rpc edges (between a worker's RecvRpcBackward and the other worker's
    SendRpcBackward) thick, dashed and purple; gradient norms under the leaves."""
    places = layout.autograd_layout(snapshot)
    colours = {name: colour(lane.index) for name, lane in places.lanes.items()}
    details = describe.autograd_details(snapshot) if titles else {}
    grads = {(g.get("worker"), g.get("param")): g for g in snapshot.get("gradients", [])}
    nodes = {n["id"]: n for n in snapshot.get("nodes", [])}
    per = collections.Counter(n.get("worker") for n in nodes.values())
    parts = [_open(places.width, places.height, "autograd"), '<g class="nbrpc-lanes">']
    for name, lane in places.lanes.items():
        parts.append(_lane(lane, [f"{per[name]} function{'s' * (per[name] != 1)}"], colours[name]))
    parts.append('</g><g class="nbrpc-edges" fill="none">')
    for e in snapshot.get("edges", []):
        if e["src"] in places.positions and e["dst"] in places.positions:
            parts.append(_autograd_edge(e, places, nodes))
    parts.append('</g><g class="nbrpc-nodes">')
    for fn_id in sorted(nodes, key=layout.natural_key):
        parts.append(_function(nodes[fn_id], places, colours, grads, details.get(fn_id)))
    parts.append("</g></svg>")
    return "".join(parts)


def _autograd_edge(edge: dict, places: Layout, nodes: dict) -> str:
    (x1, y1), (x2, y2) = places.positions[edge["src"]], places.positions[edge["dst"]]
    y1, y2 = y1 + FN_H / 2, y2 - FN_H / 2
    bend = max(14.0, (y2 - y1) / 2)
    path = f"M{num(x1)},{num(y1)} C{num(x1)},{num(y1 + bend)} {num(x2)},{num(y2 - bend)} {num(x2)},{num(y2)}"
    workers = esc(" ".join(dict.fromkeys([nodes[edge["src"]]["worker"], nodes[edge["dst"]]["worker"]])))
    ends = f'data-src="{esc(edge["src"])}" data-dst="{esc(edge["dst"])}" data-workers="{workers}"'
    if edge.get("kind") == "rpc":
        return (f'<g class="nbrpc-rpc" {ends}><path d="{path}" stroke="{RPC}" stroke-width="2.2" '
                f'stroke-dasharray="6 4"/>{_arrow(x2, y2, x2, y2 - bend, RPC, 8)}</g>')
    return (f'<g class="nbrpc-local" {ends}><path class="nbrpc-line" d="{path}" stroke="{MUTED}" '
            f'stroke-width="1.2"/>{_arrow(x2, y2, x2, y2 - bend, MUTED, role="nbrpc-tick")}</g>')


def _function(node: dict, places: Layout, colours: dict, grads: dict, details: dict | None) -> str:
    x, y = places.positions[node["id"]]
    fill = colours[node["worker"]]
    name = node.get("name") or "?"
    is_rpc = name.startswith(("SendRpcBackward", "RecvRpcBackward"))
    stroke, width = (RPC, "1.6") if is_rpc else (fill, "1")
    label = node.get("param") or name
    box = places.box_w.get(node["worker"], FN_W)
    # Lightly tinted boxes in both themes: the label (theme ink) reads on them either way.
    parts = [f'<g class="nbrpc-node" data-id="{esc(node["id"])}" data-workers="{esc(node["worker"])}">'
             f'<rect x="{num(x - box / 2)}" y="{num(y - FN_H / 2)}" width="{num(box)}" height="{FN_H}" rx="4" '
             f'fill="{fill}" fill-opacity="{"0.3" if node.get("param") else "0.12"}" stroke="{stroke}" '
             f'stroke-width="{width}"/>'
             f'<text class="nbrpc-ink" x="{num(x)}" y="{num(y + 4)}" text-anchor="middle" fill="{INK}">'
             f'{esc(clip(label, layout.label_chars(box)))}</text>']
    grad = grads.get((node["worker"], node.get("param"))) if node.get("param") else None
    if grad is not None:
        norm = esc(describe.norm_text(grad.get("norm")))
        parts.append(f'<text class="nbrpc-grad nbrpc-tick" x="{num(x)}" y="{num(y + FN_H / 2 + 11)}" '
                     f'text-anchor="middle" font-size="10" fill="{MUTED}">\u2016grad\u2016 {norm}</text>')
    parts.append(title(details))
    parts.append("</g>")
    return "".join(parts)


def static_html(svg: str, summary: str) -> str:
    """The ``text/html`` fallback: the SVG fitted to the output's width (themed where
    JupyterLab's variables are), the summary under it."""
    return (f'<div class="nbrpc-graph-static nbrpc-fit" style="max-width:100%;overflow:auto">'
            f'{theme_style()}{svg}'
            f'<div style="font-size:11px;color:var(--jp-ui-font-color1,{MUTED})">{esc(summary)}</div></div>')
