"""The private parts of jupyter_client and IPython that nbrpc uses.

``deploy.launchers.local`` waits for a new kernel's ``kernel_info_reply`` itself (in
short steps a start-up can cancel), then hands it to the client as
``KernelClient.wait_for_ready`` would, so the client learns the kernel's protocol
version. Known to work with jupyter_client 8. ``cell_number`` reads which cell an
IPython cell file holds (known to work with IPython 8 and 9), for the remote
tracebacks of notebook functions (``wire/definitions``); it never imports IPython.
``tests/test_compat.py`` reads both.
"""

from __future__ import annotations

import sys

from jupyter_client.client import KernelClient


def take_kernel_info(client: KernelClient, reply: dict) -> None:
    """``KernelClient._handle_kernel_info_reply``: the client adopts the kernel's
    protocol version (and adapts its messages to it)."""
    client._handle_kernel_info_reply(reply)


def cell_number(filename: str) -> int | None:
    """The execution count of the cell compiled as ``filename`` in this process's IPython
    shell (``CachingCompiler._filename_map``), or None (no shell, not a cell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return names.get(filename) if isinstance(names, dict) else None
