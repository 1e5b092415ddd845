"""The nbrpc kernel: ipykernel in a user namespace of its own, so that its local clusters
get a private network (see ``private_network``).

Its kernel spec runs this file by path (``python .../nbrpc/shared_server/kernel.py -f
{connection_file}``), not with ``-m``: only a process with one thread can enter a user
namespace, and importing the nbrpc package (torch, numpy's thread pool) starts threads.
Where the server forbids user namespaces the kernel starts as a plain one, and says why
in ``NBRPC_NO_PRIVATE_NETWORK``. It ends with the server that launched it, from its first
step (``watch_parent``). ``install`` writes the kernel spec.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import sys
import threading
import time

NAME = "nbrpc"
DISPLAY_NAME = "Python 3 (nbrpc)"
# Set in the kernel's environment when it could not have a private network (the reason).
NO_PRIVATE_NETWORK_ENV = "NBRPC_NO_PRIVATE_NETWORK"


def spec() -> dict:
    """The kernel spec (``kernel.json``) for this environment's Python."""
    return {"argv": [sys.executable, os.path.abspath(__file__), "-f", "{connection_file}"],
            "display_name": DISPLAY_NAME, "language": "python", "metadata": {"debugger": True}}


def install(user: bool = False, prefix: str | None = None) -> str:
    """Install the kernel spec (for this user, under ``prefix``, or system-wide); return its folder."""
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "kernel.json"), "w") as f:
            json.dump(spec(), f, indent=1)
        return KernelSpecManager().install_kernel_spec(folder, NAME, user=user, prefix=prefix)


def _private_network():
    """``private_network`` loaded by path, without the package (and its threads)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "private_network.py")
    loaded = importlib.util.spec_from_file_location("_nbrpc_private_network_bootstrap", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def watch_parent() -> None:
    """End this kernel when the process that launched it ends: from its first step, where
    ipykernel's own watch starts seconds later, once it has started.

    A server that ended in between (culled, or stopped, as the kernel started) left the
    kernel a new parent, which ipykernel takes for its own unless it is init: under a
    subreaper (a container's init, ``systemd --user``, a CI runner) the kernel outlived its
    server. Only a kernel that jupyter_client launched itself is watched (its parent is
    ``JPY_PARENT_PID``); one behind a wrapper (``srun``, ``sudo``) is left to ipykernel, as
    is one whose server ended before this step.
    """
    parent = int(os.environ.get("JPY_PARENT_PID") or 0)
    if parent <= 1 or os.getppid() != parent:
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        # To the kernel's log (its file, not the sys.stderr ipykernel sends to the notebook).
        os.write(2, f"nbrpc kernel: the process that launched it ({parent}) has ended; the kernel ends too\n"
                 .encode())
        os._exit(1)

    threading.Thread(target=watch, name="nbrpc-parent-watch", daemon=True).start()


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this folder's modules are not top-level names
    why = _private_network().enter_user_namespace()
    if why:
        os.environ[NO_PRIVATE_NETWORK_ENV] = why
    watch_parent()  # a thread: after the user namespace, which only a one-threaded process enters
    runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
