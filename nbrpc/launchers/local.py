"""Worker kernels on this machine: launch, connect, watch and end them by pid.

Parts:

- ``LocalWorker``: a worker process on this machine, known by its pid.
- ``LocalLauncher``: starts every worker at once (forked from the warm template,
  ``nbrpc.launchers.template``, or launched fresh), all sockets on loopback, and waits until
  each has joined RPC and answers on the Jupyter protocol, or fails with the
  worker's own output.
- ``launch`` and ``wait_ready``: one worker's process, and its kernel's first answer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from queue import Empty

from jupyter_client import BlockingKernelClient
from jupyter_client.launcher import launch_kernel
from jupyter_core.utils import ensure_event_loop

from .._compat import jupyter_compat
from .._util import LOOPBACK, kill_pids, pid_alive, pid_stopped
from ..errors import WorkerStartError
from ..group import membership
from ..settings import FAST_ALLOC_ENV
from ..shared_server import private_network, scratch
from . import template
from .base import Admission, Worker, close_clients, connect, mark_stopped, write_unbound_connection_file


@dataclass
class LocalWorker(Worker):
    """A worker kernel on this machine: its process and its output."""

    log_path: str = ""
    _popen: object = field(default=None, repr=False)
    # Set once the process ``stop`` ended has been reaped (see ``LocalLauncher.stop``).
    _reaped: threading.Event | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid)

    def stopped(self) -> bool:
        return self.pid is not None and pid_stopped(self.pid)

    def interrupt(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGINT)

    def exit_code(self) -> int | None:
        if self._popen is None:
            return None
        if self._reaped is not None:  # ended by stop(): reaped by its thread, soon
            self._reaped.wait(REAP_WAIT)
        return self._popen.poll()

    def fate(self) -> str | None:
        if self.alive():
            return None
        code = self.exit_code()
        if code is None and self._popen is not None:
            try:  # it has ended, but its last threads may still be exiting
                code = self._popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        how = f"was killed by signal {-code}" if code is not None and code < 0 else (
            f"exited with code {code}" if code is not None else "is not running"
        )
        return f"(pid {self.pid}) {how}"

    def log_tail(self, lines: int = 30) -> str:
        """The end of the worker's own stdout/stderr, for start-up errors."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""


REAP_WAIT = 10.0  # seconds exit_code waits for a worker stop() ended to be reaped


def _reap(processes: list, reaped: threading.Event) -> None:
    """Wait for each ended process, so that none is left a zombie; then say so."""
    for process in processes:
        try:
            process.wait(timeout=REAP_WAIT)
        except subprocess.TimeoutExpired:
            pass
    reaped.set()


class LocalLauncher:
    """Worker kernels on this machine, named ``names``, all sockets on loopback."""

    interface = "lo"
    command = None
    own_gpus = False

    def __init__(self, names: list[str], warm_start: bool):
        self.workers = [LocalWorker(name, rank) for rank, name in enumerate(names, 1)]  # ranks: at admission
        self.warm_start = warm_start

    def planned(self) -> list[Worker]:
        return list(self.workers)

    def placement_names(self) -> list[str]:
        return [w.name for w in self.workers]

    def prepare(self) -> None:
        if self.warm_start:
            template.prestart()  # it imports torch while the driver joins RPC

    def start(self, cluster: Admission, driver: membership.DriverGroup, deadline: float) -> None:
        store = f"{LOOPBACK}:{driver.store.port}"
        settings = [(w, cluster.admit(w).for_this_machine(store, os.getpid(), self.interface))
                    for w in self.workers]
        total = len(self.workers)
        cluster.progress(0, total, f"starting {total} worker kernel{'s' * (total > 1)}")
        for w, s in settings:
            launch(w, s.to_env(), os.getcwd(), warm_start=self.warm_start)
        self._await_joined(cluster, deadline)

    def close(self) -> None:
        pass

    def stop(self, workers: list[Worker]) -> None:
        """Close clients and end every process by pid (SIGTERM, then SIGKILL)."""
        close_clients(workers)
        kill_pids([w.pid for w in workers if w.pid is not None])
        # A killed kernel is exiting (it counts as ended) a moment before it can be
        # reaped: its threads end and its memory is given back, which took 32 workers
        # 0.6 s on 2 busy cores. A thread reaps them while shutdown returns;
        # ``exit_code`` waits for it.
        exiting = [w for w in workers if w._popen is not None and w._popen.poll() is None]
        if exiting:
            reaped = threading.Event()
            for worker in exiting:
                worker._reaped = reaped
            threading.Thread(target=_reap, args=([w._popen for w in exiting], reaped),
                             name="nbrpc-reap", daemon=True).start()
        mark_stopped(workers)

    def _await_joined(self, cluster: Admission, deadline: float) -> None:
        waiting, total = list(self.workers), len(self.workers)
        # Each kernel's readiness check (kernel_info, then IOPub) runs as soon as it
        # joined, alongside the others, not one after another.
        ready: dict[str, threading.Thread] = {}
        failed: dict[str, RuntimeError] = {}
        cancel = threading.Event()

        def check(w: LocalWorker) -> None:
            try:
                wait_ready(w.client, max(1.0, deadline - time.monotonic()), cancel)
            except RuntimeError as e:
                failed[w.name] = e
            finally:  # the event loop jupyter-client made for this thread
                asyncio.set_event_loop(None)
                ensure_event_loop().close()

        try:
            while waiting:
                members = set(membership.member_names())
                for w in list(waiting):
                    if w.name in members:
                        waiting.remove(w)
                        connect(w)
                        ready[w.name] = threading.Thread(target=check, args=(w,), daemon=True,
                                                         name=f"nbrpc-ready-{w.name}")
                        ready[w.name].start()
                        cluster.progress(total - len(waiting), total, f"{w.name} joined")
                    elif not w.alive():
                        raise WorkerStartError(_start_failure(w, f"exited before joining ({w.fate()})"))
                if waiting and time.monotonic() > deadline:
                    raise WorkerStartError(_start_failure(
                        waiting[0], f"did not join within startup_timeout={cluster.startup_timeout:g} s"))
                time.sleep(0.02)
        except BaseException:
            cancel.set()  # another worker failed: do not wait out these checks
            raise
        finally:
            for thread in ready.values():  # no client is in use by two threads at once
                thread.join()
        for w in self.workers:
            if w.name in failed:
                raise WorkerStartError(_start_failure(w, f"kernel did not answer: {failed[w.name]}")) \
                    from failed[w.name]
            w.state = "running"


def _start_failure(w: LocalWorker, what: str) -> str:
    tail = w.log_tail().strip() or "(no output)"
    return (
        f"worker {w.name!r} (pid {w.pid}) {what}. Its output:\n{tail}\n"
        "Fix the cause above (a package missing from this environment, a crash at import, "
        "a machine out of memory), or raise startup_timeout / %rpc_init --startup-timeout."
    )


def launch(worker: LocalWorker, env: dict[str, str], workdir: str, warm_start: bool | None = None) -> None:
    """Start ``worker``'s kernel process; it joins RPC by itself from ``env``.

    The process is forked from the warm template (``nbrpc.launchers.template``) unless warm
    start is off or the template cannot serve it; then it is a fresh Python.
    """
    folder = scratch.make(worker.name, sockets=True)  # only this user can enter it
    worker.connection_file = os.path.join(folder, "kernel.json")
    # The kernel's sockets are files in that directory, out of other local users' reach.
    write_unbound_connection_file(worker.connection_file, os.path.join(folder, "kernel"), "ipc")
    worker.log_path = os.path.join(folder, "output.log")
    argv = ["-f", worker.connection_file]
    full_env = {**os.environ, **FAST_ALLOC_ENV, **env}
    with open(worker.log_path, "wb") as log:
        if template.enabled(warm_start):
            # As launch_kernel says it: the kernel ends when this process does.
            forked = template.launch(worker.name, argv, {**full_env, "JPY_PARENT_PID": str(os.getpid())},
                                     workdir, worker.log_path)
            if forked is not None:
                worker._popen, worker.pid = forked, forked.pid
                scratch.add_owner(folder, worker.pid)
                return
        def start() -> subprocess.Popen:
            jupyter_compat.stop_debugging_new_processes()  # the notebook's debugger must not start it
            return launch_kernel([sys.executable, "-m", "nbrpc.member.worker", *argv],
                                 stdout=log, stderr=log, env=full_env, cwd=workdir)

        network = private_network.NETWORK  # a process starts in its starting thread's network
        worker._popen = network.run(start) if network.for_local_workers() else start()
    worker.pid = worker._popen.pid
    scratch.add_owner(folder, worker.pid)


def wait_ready(client: BlockingKernelClient, timeout: float, cancel: threading.Event | None = None) -> None:
    """What ``client.wait_for_ready`` checks (a kernel_info reply, IOPub connected).

    Without its first wait for a heartbeat, polled every 0.2 s: a worker binds its
    ports before it joins RPC, so one that joined is up, and that wait added 0.2 s
    to every start. Setting ``cancel`` ends the wait within a second.
    """
    deadline = time.monotonic() + timeout
    while True:
        client.kernel_info()
        try:
            reply = client.get_shell_msg(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except Empty:
            reply = None
        if reply is not None and reply["msg_type"] == "kernel_info_reply":
            try:
                client.get_iopub_msg(timeout=0.2)  # IOPub delivers (the reply's status messages)
            except Empty:
                pass
            else:
                jupyter_compat.take_kernel_info(client, reply)
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        if cancel is not None and cancel.is_set():
            raise RuntimeError("the start was abandoned")
