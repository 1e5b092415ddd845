"""``write_report``: a trace as one self-contained HTML page, for a browser or a colleague.

The page holds the timeline's SVG, the summary per function and callee, the hover
details as JSON, and ``timeline.js`` and ``timeline.css`` inline: the same front end as
the widget, driven by a model that only answers ``get``. It imports no ipywidgets,
anywidget or IPython, so a plain script can write it, and needs no network to open.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import timeline_layout as tl
from . import timeline_svg as ts
from .svg import THEME_CSS

# The timeline's own script and style, beside its widget.
ASSETS = Path(__file__).parent.parent / "widgets"


def front_end_script(name: str) -> str:
    """A front end's ES module: the parts the front ends share (``view_parts.js``: plain
    declarations, no bundler) followed by the module's own text."""
    return "".join((ASSETS / part).read_text(encoding="utf-8") for part in ("view_parts.js", name))

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ margin: 16px; font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }}
{css}
</style></head>
<body>
<h3 style="margin:0 0 6px">{title}</h3>
<div id="nbrpc-timeline">{static}</div>
<script type="application/json" id="nbrpc-timeline-state">{state}</script>
<script type="module">
{js}
const state = JSON.parse(document.getElementById("nbrpc-timeline-state").textContent);
const el = document.getElementById("nbrpc-timeline");
el.replaceChildren();  // the static copy stays for pages opened without scripts
const model = {{
  get: (name) => state[name],
  set: (name, value) => {{ state[name] = value; (listeners[name] || []).forEach((f) => f()); }},
  save_changes: () => {{}},
  on: (event, f) => {{ const name = event.replace("change:", ""); (listeners[name] ||= []).push(f); }},
  off: () => {{}},
}};
const listeners = {{}};
render({{ model, el }});
</script>
</body></html>
"""


def _script_safe(text: str) -> str:
    """JSON or code inside a ``<script>``: no ``</`` can end it early."""
    return text.replace("</", "<\\/")


def write_report(snapshot: dict, path: str | os.PathLike, *, threads: bool = False,
                 title: str = "nbrpc RPC timeline") -> None:
    """Write ``snapshot`` (a ``TraceSnapshot``) to ``path`` as a self-contained HTML page:
    the timeline (wheel to zoom, drag to pan, hover and click for a call's details) and
    the summary per function and callee."""
    place = tl.timeline_layout(snapshot, threads=threads)
    drawing = ts.draw(snapshot, place, titles=False)
    state = {
        "svg": drawing, "table": ts.summary_html(snapshot), "selected": "", "follow": False,
        "details": ts.busy_details(place) if place.aggregated else ts.call_details(snapshot),
        "status": "", "fit": True,
    }
    js = front_end_script("timeline.js").replace("export default { render };", "")
    page = PAGE.format(title=ts.esc(title), css=(ASSETS / "timeline.css").read_text(encoding="utf-8") + THEME_CSS,
                       static=ts.static_html(snapshot, ts.draw(snapshot, place), place),
                       state=_script_safe(json.dumps(state)), js=_script_safe(js))
    Path(path).write_text(page, encoding="utf-8")
