"""Worker bootstrap: a real ipykernel that is also a member of the driver's RPC group.

The driver launches ``python -m nbrpc.worker -f CONNECTION_FILE`` with the group's
coordinates in ``NBRPC_*`` environment variables. The kernel binds its ZMQ ports,
joins RPC, then serves execute requests (``%%rpc_on``) on its main thread while
TensorPipe threads serve RPCs. A watchdog ends the process when the driver is gone.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from . import group
from ._util import pid_alive

WATCH_INTERVAL = 0.5


def main(argv: list[str] | None = None) -> None:
    env = os.environ
    _watch_driver(int(env["NBRPC_DRIVER_PID"]))
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(argv)
    host, port = env["NBRPC_STORE"].rsplit(":", 1)
    timeout = float(env["NBRPC_TIMEOUT"])
    store = group.connect_store(host, int(port), timeout)
    options = group.backend_options(int(env["NBRPC_THREADS"]), timeout)
    group.join(
        store, env["NBRPC_PREFIX"], env["NBRPC_NAME"], int(env["NBRPC_RANK"]),
        options, env.get("NBRPC_INTERFACE") or None, env.get("NBRPC_TRACK", "1") == "1",
    )
    app.start()


def leave(timeout: float = 20.0) -> None:
    """Leave the RPC group gracefully; the driver runs this in the kernel at shutdown."""
    group.leave(graceful=True, timeout=timeout)


def _watch_driver(driver_pid: int) -> None:
    """Exit at once when the driver process ends (killed, restarted, crashed)."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent and pid_alive(driver_pid):
            time.sleep(WATCH_INTERVAL)
        # The RPC agent's threads would block a normal interpreter exit.
        os._exit(3)

    threading.Thread(target=watch, name="nbrpc-driver-watch", daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
