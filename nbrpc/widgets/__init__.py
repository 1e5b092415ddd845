"""Widgets: the cluster status, the RRef graph and the autograd graph.

Importing this package imports ipywidgets and anywidget; the runtime (``nbrpc``
itself) never does, and reaches these classes only when one is made.
"""

from .autograd_graph import AutogradGraph
from .base import StaticView
from .rref_graph import RRefGraph
from .status import ClusterStatus

__all__ = ["AutogradGraph", "ClusterStatus", "RRefGraph", "StaticView"]
