"""Widgets: the cluster status, the RRef graph, the autograd graph, the RPC timeline and
the wait-for graph of pending calls.

The widget classes import ipywidgets and anywidget; the runtime (``nbrpc`` itself)
never does, and reaches these classes only when one is made. The drawing modules
(``layout``, ``svg``, ``timeline_layout``, ``timeline_svg``, ``waits_layout``,
``waits_svg``) and ``report`` import
neither, so a script can draw and write reports without them: this package's
``__init__`` imports the classes on first use.
"""

import importlib

_CLASSES = {"AutogradGraph": "autograd_graph", "ClusterStatus": "status", "RRefGraph": "rref_graph",
            "StaticView": "base", "Timeline": "timeline", "WaitsGraph": "waits_graph"}

__all__ = ["AutogradGraph", "ClusterStatus", "RRefGraph", "StaticView", "Timeline", "WaitsGraph"]


def __getattr__(name: str):
    if name in _CLASSES:
        return getattr(importlib.import_module(f".{_CLASSES[name]}", __name__), name)
    raise AttributeError(f"module 'nbrpc.widgets' has no attribute {name!r}")
