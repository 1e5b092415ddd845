"""Drawn text stays readable: fitted into a narrow output, no drawing shows text under
9 px; it scrolls instead (each root ``<svg>``'s ``min-width``)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from _snapshots import AUTOGRAD, RREF, TRACE, autograd_wide, synthetic, trace_synthetic

from nbrpc.drawing import svg, timeline_svg, waits_svg

# The width of a notebook output in JupyterLab at 1280 px.
OUTPUT_W = 848
WAITS = {
    "members": [{"name": "master", "threads": 4, "busy": 1, "state": "running"},
                {"name": "w1", "threads": 4, "busy": 1, "state": "running"}],
    "calls": [{"id": "master:1", "caller": "master", "callee": "w1", "function": "ping", "site": "cell 3, line 1",
               "thread": "t", "since": 1.0, "state": "running", "waits_on": ["w1:1"]},
              {"id": "w1:1", "caller": "w1", "callee": "master", "function": "pong", "site": None,
               "thread": "t", "since": 1.5, "state": "queued", "waits_on": []}],
    "findings": [{"kind": "cycle", "members": ["master", "w1"], "calls": ["master:1", "w1:1"],
                  "message": "master and w1 wait on each other"}],
}


def smallest_shown(drawing: str, shown_width: float) -> float:
    """The smallest text size in px once a page fits ``drawing`` to ``shown_width`` px
    (a fitted drawing shrinks to the width it has, never under its ``min-width``)."""
    root = ET.fromstring(drawing)
    width = float(root.get("width"))
    narrowest = float(re.search(r"min-width:\s*([\d.]+)px", root.get("style", "")).group(1))
    scale = min(1.0, max(shown_width, narrowest) / width)
    sizes = []

    def walk(node: ET.Element, size: float) -> None:
        size = float(node.get("font-size", size))
        if node.tag.endswith("}text") and (node.text or "").strip():
            sizes.append(size)
        for child in node:
            walk(child, size)

    walk(root, 16.0)
    return min(sizes) * scale


DRAWINGS = {
    "rref": lambda: svg.rref_svg(RREF),
    "rref-large": lambda: svg.rref_svg(synthetic(300, 8)),
    "autograd": lambda: svg.autograd_svg(AUTOGRAD),
    "autograd-three-workers": lambda: svg.autograd_svg(autograd_wide(("master", "w1", "w2"), per_layer=6, layers=8)),
    "timeline": lambda: timeline_svg.timeline_svg(TRACE),
    "timeline-large": lambda: timeline_svg.timeline_svg(trace_synthetic(2000, 4)),
    "waits": lambda: waits_svg.waits_svg(WAITS),
}


@pytest.mark.parametrize("kind", sorted(DRAWINGS))
def test_fitted_text_is_never_under_9_px(kind):
    drawing = DRAWINGS[kind]()
    for shown in (OUTPUT_W, 300):
        assert smallest_shown(drawing, shown) >= svg.READABLE_TEXT - 1e-6, (kind, shown)


def test_a_wide_drawing_scrolls_rather_than_shrinks():
    drawing = svg.autograd_svg(autograd_wide(("master", "w1", "w2"), per_layer=6, layers=8))
    root = ET.fromstring(drawing)
    assert float(root.get("width")) * 0.9 > OUTPUT_W  # wider than an output even at 9 px
    assert smallest_shown(drawing, OUTPUT_W) == pytest.approx(svg.READABLE_TEXT, abs=0.01)
