"""The private parts of jupyter_client and ipykernel that nbrpc uses.

``launchers.local`` waits for a new kernel's ``kernel_info_reply`` itself (in
short steps a start-up can cancel), then hands it to the client as
``KernelClient.wait_for_ready`` would, so the client learns the kernel's protocol
version. Known to work with jupyter_client 8. ``kernel_ext.lab_debugger`` publishes its
members' debugger events as the driver kernel's own (ipykernel 6 and 7), and the
launchers start processes without debugpy's patches. ``tests/test_compat.py`` reads them.
"""

from __future__ import annotations

from jupyter_client.client import KernelClient


def take_kernel_info(client: KernelClient, reply: dict) -> None:
    """``KernelClient._handle_kernel_info_reply``: the client adopts the kernel's
    protocol version (and adapts its messages to it)."""
    client._handle_kernel_info_reply(reply)


def publish_debug_event(kernel, event: dict) -> None:
    """``Kernel._publish_debug_event``: ``event`` on the kernel's IOPub as a
    ``debug_event``, as the kernel's own debugger sends its events (ipykernel 6 and 7)."""
    kernel._publish_debug_event(event)


def stop_debugging_new_processes() -> None:
    """Undo debugpy's patches of process creation (``pydev_monkey``, debugpy 1.8): each
    patched function's original is kept as ``original_<name>`` in its module. Once
    ``debugpy.listen`` ran (the kernel's debugger starting), every Python process started
    would run under pydevd and connect back; nbrpc's template and workers must start
    plainly, as their own kernels' debuggers are reached through the driver. The
    ``original_`` names stay, so debugpy does not patch again."""
    import os
    import subprocess

    modules = [os, subprocess]
    try:
        import _posixsubprocess

        modules.append(_posixsubprocess)
    except ImportError:  # not on Windows
        pass
    for module in modules:
        for name in [n for n in vars(module) if n.startswith("original_")]:
            setattr(module, name[len("original_"):], getattr(module, name))


def hide_from_debugger(thread) -> None:
    """pydevd's marks of its own threads, which ipykernel also puts on its threads (control,
    IOPub, heartbeat): ``thread`` (not started yet) is never traced nor paused, so the
    driver's helpers keep answering while the debugger has stopped every other thread."""
    thread.pydev_do_not_trace = True
    thread.is_pydev_daemon_thread = True
