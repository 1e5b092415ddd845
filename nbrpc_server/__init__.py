"""The Jupyter server extension behind JupyterLab's nbrpc side panel.

A package beside ``nbrpc``, not inside it: ``import nbrpc`` imports torch, and a Jupyter
server that loads this extension must not pay for torch whether or not anyone uses nbrpc.
Parts: ``protocol`` (the names the kernel, the server and the TypeScript share),
``drivers`` (asking the kernels that run a cluster over their control channel),
``handlers`` (the endpoints at ``<base_url>/nbrpc/...``) and ``app`` (the extension,
which closes the channels when the server stops).
"""

from __future__ import annotations

__all__ = ["_jupyter_server_extension_points"]


def _jupyter_server_extension_points() -> list[dict]:
    from .app import PanelServerExtension

    return [{"module": "nbrpc_server", "app": PanelServerExtension}]
