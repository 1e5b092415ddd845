"""Worker bootstrap: a real ipykernel that is also a member of the driver's RPC group.

The driver launches ``python -m nbrpc.member.worker -f CONNECTION_FILE`` with the group's
coordinates in its environment (``settings.WorkerSettings``). The kernel binds its ZMQ ports,
joins RPC, then serves execute requests (``%%rpc_on``) on its main thread while
TensorPipe threads serve RPCs. A watchdog ends the process when the driver is gone.

A worker on another machine starts with ``nbrpc worker --join HOST:PORT`` instead
(``join_driver``): the driver hands it the same settings over its rendezvous, and the
join connection, kept open, is its watchdog.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable

from .._util import pid_alive
from ..calls import output
from ..group import devices, membership
from ..recording import clocks
from ..settings import WorkerSettings, clock_skew
from ..wire import remote_errors, serialization, shared_tensors
from . import control, lab_debugger, streams

WATCH_INTERVAL = 0.5


def main(argv: list[str] | None = None, on_kernel: Callable | None = None,
         settings: WorkerSettings | None = None) -> None:
    """Serve as a worker: ``settings`` given (a worker that joined from elsewhere), or
    read from this process's environment (a local worker, started with them there)."""
    settings = settings or WorkerSettings.from_env(os.environ)
    sys.path[:0] = [p for p in settings.import_path if p not in sys.path]
    if settings.driver_pid is not None:  # a worker joined from elsewhere has its lifeline instead
        _watch_driver(settings.driver_pid, _scratch(argv or []))
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.outstream_class = streams.OUTSTREAM_CLASS
    app.initialize(argv)
    control.serve(app.kernel, settings.name)  # answers while every RPC thread is blocked
    lab_debugger.serve(app.kernel)  # JupyterLab's debugger reaches this kernel's, through the driver's
    _show_remote_errors(app.shell)
    if on_kernel is not None:
        on_kernel(app)
    host, port = settings.store.rsplit(":", 1)
    serialization.set_key(settings.key)
    shared_tensors.enable(settings.shared_tensors, settings.shared_tensors_min_bytes)
    clocks.set_skew(clock_skew())  # a test's other machine, on this one
    store = membership.connect_store(host, int(port), settings.timeout)
    options = membership.backend_options(settings.threads, settings.timeout, settings.placement,
                                    settings.transport)
    membership.join(store, settings.prefix, settings.name, settings.rank, options, settings.interface,
               settings.track, settings.trace)
    streams.install(app, settings.name)
    app.start()


def _show_remote_errors(shell) -> None:
    """A remote error in a ``%%rpc_on`` cell names this kernel's cells as IPython would
    (``remote_errors.show_in_cell``); any other error shows as usual."""

    def handle(shell, etype, value, tb, tb_offset=None):
        if remote_errors.show_in_cell(shell, etype, value, tb, tb_offset) is None:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)

    shell.set_custom_exc((Exception,), handle)


def join_driver(address: str, token: str, name: str | None = None) -> None:
    """``nbrpc worker --join``: join the driver at ``address``, then serve as its worker.

    The driver checks the token and grants a rank, a name and the cluster's
    settings; the driver's store is reached through a token-checked relay; the
    kernel's ports listen on the address that reached the driver; the join
    connection stays open as a lifeline (this process exits when it ends).
    """
    import json
    import shutil
    import signal

    from .._util import LOOPBACK
    from ..launchers import addresses, rendezvous
    from ..launchers.base import write_unbound_connection_file
    from ..shared_server import scratch as folders

    store_port = rendezvous.relay_store(address, token)
    sock, grant = rendezvous.request_join(address, token, name, devices.visible_gpus())
    ip = sock.getsockname()[0]
    settings = WorkerSettings.from_wire(grant["settings"], f"{LOOPBACK}:{store_port}",
                                        addresses.interface_of(ip))
    os.environ.update(settings.env)  # the cluster's extra variables, for the user's code
    scratch = folders.make(grant["name"])
    connection_file = os.path.join(scratch, "kernel.json")
    write_unbound_connection_file(connection_file, ip)

    # The kernel sends this process's stdout and stderr to its clients; the terminal
    # (or the ssh session, or the batch log) still gets what this bootstrap says.
    console = os.fdopen(os.dup(2), "w")

    def say(text: str) -> None:
        print(f"nbrpc worker {grant['name']}: {text}", file=console, flush=True)

    def end(code: int, why: str = "") -> None:
        say(f"the driver {why}; exiting" if why else "the driver ended the cluster; exiting")
        shutil.rmtree(scratch, ignore_errors=True)
        os._exit(code)

    def on_message(message: dict) -> None:
        if "exit" in message:
            end(int(message["exit"]))
        elif message.get("interrupt"):
            os.kill(os.getpid(), signal.SIGINT)

    def report(app) -> None:
        with open(app.abs_connection_file) as f:
            rendezvous.send(sock, {"kernel": json.load(f)})
        rendezvous.Link(sock, rendezvous.ORPHANED_AFTER, on_message, lambda why: end(3, why))

    say(f"admitted by {address} (rank {grant['rank']}); kernel and RPC on {ip}")

    main(["-f", connection_file], on_kernel=report, settings=settings)


def leave_together(drain: float = 2.0) -> None:
    """The cluster ends, every worker at once: this worker's RRefs are deleted (with the
    driver's and the other workers', at the same time), then its own calls still in
    flight are given ``drain`` seconds. The driver runs this in the kernel at shutdown,
    then ends the process and forgets it: a graceful leave one by one (``leave``) tells
    every remaining member of each leaver under torch's membership lock, which grows
    with the square of the workers, for members that are all about to end anyway."""
    output.stop_routing()
    membership.release_rrefs()
    deadline = time.monotonic() + drain
    while membership.calls_in_flight() and time.monotonic() < deadline:
        time.sleep(0.02)


def leave(timeout: float = 20.0) -> None:
    """Leave the RPC group gracefully, its RRefs deleted first (with the driver's and
    the other workers', at the same time); the driver runs this in the kernel at shutdown."""
    output.stop_routing()
    membership.release_rrefs()
    membership.leave(graceful=True, timeout=timeout)


def _scratch(argv: list[str]) -> str | None:
    """The folder the driver made for this worker (connection file, log, sockets)."""
    if "-f" not in argv[:-1]:
        return None
    folder = os.path.dirname(argv[argv.index("-f") + 1])
    return folder if os.path.basename(folder).startswith("nbrpc-") else None


def _watch_driver(driver_pid: int, scratch: str | None) -> None:
    """Exit at once when the driver process ends (killed, restarted, crashed), taking
    the folder the driver would have removed with it."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent and pid_alive(driver_pid):
            time.sleep(WATCH_INTERVAL)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        # The RPC agent's threads would block a normal interpreter exit.
        os._exit(3)

    threading.Thread(target=watch, name="nbrpc-driver-watch", daemon=True).start()


if __name__ == "__main__":
    main(sys.argv[1:])
