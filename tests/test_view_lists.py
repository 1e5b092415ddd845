"""One view, every place that lists it: the protocol's views (Python), the widgets and their
ES modules (JavaScript), the driver's panel answers and the magics, and the side panel's
TypeScript. A view added in one place and not the others fails here, naming the place
(CONTRIBUTING.md, "A new view", is the checklist)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import nbrpc.widgets
import nbrpc_server.protocol as protocol
from nbrpc.kernel_ext import magics, panel

REPO = Path(__file__).resolve().parents[1]
TYPESCRIPT = REPO / "labextension" / "src"

# Each view: the widget class that shows it in a cell (None: text only) and the magic.
PARTS = {
    "rref": ("RRefGraph", "rref_graph"),
    "timeline": ("Timeline", "rpc_timeline"),
    "waits": ("WaitsGraph", "rpc_waits"),
    "autograd": ("AutogradGraph", "autograd_graph"),
    "status": ("ClusterStatus", "rpc_status"),
    "stacks": (None, "rpc_stacks"),
}


def _typescript_views() -> dict[str, str]:
    """The TypeScript's views: request name -> label."""
    text = (TYPESCRIPT / "protocol.ts").read_text()
    found = re.search(r"export const VIEWS\b[^=]*=\s*\[(.*?)\]", text, re.S)
    assert found, "no VIEWS list in labextension/src/protocol.ts"
    return {name: label for label, name in re.findall(r"label:\s*'([^']+)',\s*name:\s*'([a-z]+)'", found.group(1))}


def test_every_view_has_its_parts_in_python():
    assert set(protocol.VIEWS) == set(PARTS), "a view in nbrpc_server/protocol.py without its parts here (or back)"
    assert panel.VIEWS == protocol.VIEWS
    for name, (_, magic) in PARTS.items():
        assert callable(getattr(panel.Answers, f"_{name}", None)), f"the driver's panel draws no {name!r} view"
        assert magic in magics.RpcMagics.magics["line"], f"no %{magic} for the {name!r} view"


@pytest.mark.parametrize("name", [name for name, (widget, _) in PARTS.items() if widget])
def test_every_views_widget_has_its_es_module(name):
    widget = getattr(nbrpc.widgets, PARTS[name][0])
    source = str(widget._esm)  # the module's text (anywidget reads a path into its contents)
    assert "export default { render }" in source, f"{widget.__name__}'s ES module exports no render"
    if "kind" in widget.class_traits():  # the graph views share graph.js, each with its kind
        assert f'kind="{name}"' in inspect.getsource(widget), f"{widget.__name__} draws no {name!r} graph"


def test_every_docked_view_is_its_widgets_front_end():
    from nbrpc.kernel_ext import panel_views

    widgets = {name: widget for name, (widget, _) in PARTS.items() if widget}
    assert set(panel_views.FRONT_ENDS) == set(widgets), "kernel_ext/panel_views.py FRONT_ENDS"
    for name, widget in widgets.items():
        cls = getattr(nbrpc.widgets, widget)
        assert panel_views.front_end(name) == {"esm": str(cls._esm), "css": str(cls._css)}, name


def test_the_typescript_lists_every_view_and_makes_a_command_of_each():
    views = _typescript_views()
    assert list(views) == list(protocol.VIEWS), "labextension/src/protocol.ts VIEWS"
    assert views["rref"] == "RRef graph" and views["waits"] == "Wait-for graph"  # labels name what opens
    for part in ("index.ts", "panel.ts"):  # a command and a panel action per view, from the list
        assert re.search(r"for \(const v of VIEWS\)", (TYPESCRIPT / part).read_text()), part
