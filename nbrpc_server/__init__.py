"""The Jupyter server extension behind JupyterLab's nbrpc side panel.

``drivers`` asks the kernels of this server that run a cluster (those with a beacon
next to their connection file) over their control channel; ``handlers`` serves the
answers at ``<base_url>/nbrpc/...`` behind the server's authentication and XSRF checks.
"""

from __future__ import annotations

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "nbrpc.server"}]


def _load_jupyter_server_extension(server_app) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app)
