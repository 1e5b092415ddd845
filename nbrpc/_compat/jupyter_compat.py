"""The private part of jupyter_client that a worker's kernel client uses.

``launchers.local`` waits for a new kernel's ``kernel_info_reply`` itself (in
short steps a start-up can cancel), then hands it to the client as
``KernelClient.wait_for_ready`` would, so the client learns the kernel's protocol
version. Known to work with jupyter_client 8; ``tests/test_compat.py`` reads it.
"""

from __future__ import annotations

from jupyter_client.client import KernelClient


def take_kernel_info(client: KernelClient, reply: dict) -> None:
    """``KernelClient._handle_kernel_info_reply``: the client adopts the kernel's
    protocol version (and adapts its messages to it)."""
    client._handle_kernel_info_reply(reply)
