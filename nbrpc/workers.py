"""Worker kernels on this machine: launch, connect, watch and end them by pid."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from queue import Empty
from typing import ClassVar

from jupyter_client import BlockingKernelClient
from jupyter_client.launcher import launch_kernel

from . import template
from ._util import LOOPBACK, kill_pids, pid_alive, pid_stopped

# Large tensors land in huge pages: a 100 MB RPC round trip gets several times faster
# (fewer page faults on fresh receive buffers). torch reads this once, at start.
FAST_ALLOC_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}


@dataclass
class Worker:
    """One worker kernel: its RPC identity, its process and its Jupyter client."""

    remote: ClassVar[bool] = False  # a process on this machine, known by its pid
    name: str
    rank: int
    host: str = field(default_factory=socket.gethostname)
    ip: str = LOOPBACK
    pid: int | None = None
    state: str = "starting"
    log_path: str = ""
    connection_file: str = ""
    client: BlockingKernelClient | None = field(default=None, repr=False)
    _popen: object = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.pid is not None and pid_alive(self.pid)

    def stopped(self) -> bool:
        """True while the process is frozen (SIGSTOP): alive, but it answers nothing."""
        return not self.remote and self.pid is not None and pid_stopped(self.pid)

    def interrupt(self) -> None:
        """Interrupt the code the kernel is running (what the stop button does)."""
        if self.alive():
            os.kill(self.pid, signal.SIGINT)

    def exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def fate(self) -> str | None:
        """Why this worker is gone, or None while its process runs."""
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


def launch(worker: Worker, env: dict[str, str], workdir: str, warm_start: bool | None = None) -> None:
    """Start ``worker``'s kernel process; it joins RPC by itself from ``env``.

    The process is forked from the warm template (``nbrpc.template``) unless warm
    start is off or the template cannot serve it; then it is a fresh Python.
    """
    scratch = tempfile.mkdtemp(prefix=f"nbrpc-{worker.name}-")  # only this user can enter it
    worker.connection_file = os.path.join(scratch, "kernel.json")
    # The kernel's sockets are files in that directory, out of other local users' reach.
    write_unbound_connection_file(worker.connection_file, os.path.join(scratch, "kernel"), "ipc")
    worker.log_path = os.path.join(scratch, "output.log")
    argv = ["-f", worker.connection_file]
    full_env = {**os.environ, **FAST_ALLOC_ENV, **env}
    with open(worker.log_path, "wb") as log:
        if template.enabled(warm_start):
            # As launch_kernel says it: the kernel ends when this process does.
            forked = template.launch(worker.name, argv, {**full_env, "JPY_PARENT_PID": str(os.getpid())},
                                     workdir, worker.log_path)
            if forked is not None:
                worker._popen, worker.pid = forked, forked.pid
                return
        worker._popen = launch_kernel(
            [sys.executable, "-m", "nbrpc.worker", *argv], stdout=log, stderr=log, env=full_env, cwd=workdir
        )
    worker.pid = worker._popen.pid


def write_unbound_connection_file(path: str, ip: str, transport: str = "tcp") -> None:
    """Write connection info whose ports are all 0, for the kernel to fill in.

    ``ip`` is an address for ``tcp`` and a path prefix for ``ipc`` (Unix sockets).

    The kernel binds free ports itself and writes them back before it joins RPC;
    ports picked here could be taken before the kernel binds them (by another
    worker's RPC sockets, say), and it would fail with "Address already in use".
    """
    info = {f"{channel}_port": 0 for channel in ("shell", "iopub", "stdin", "control", "hb")}
    info.update(ip=ip, transport=transport, key=uuid.uuid4().hex, signature_scheme="hmac-sha256")
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump(info, f)


def connect(worker: Worker) -> BlockingKernelClient:
    """A started client for the worker's kernel (not yet known to be ready)."""
    client = BlockingKernelClient(connection_file=worker.connection_file)
    client.load_connection_file()
    client.start_channels()
    worker.client = client
    return client


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
                client._handle_kernel_info_reply(reply)
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        if cancel is not None and cancel.is_set():
            raise RuntimeError("the start was abandoned")


def stop(workers: list[Worker]) -> None:
    """Close clients and end every process by pid (SIGTERM, then SIGKILL)."""
    for worker in workers:
        if worker.client is not None:
            worker.client.stop_channels()
            worker.client = None
    for worker in workers:
        if worker.remote:  # told over its lifeline; its pid is on another machine
            worker.release()
    kill_pids([w.pid for w in workers if w.pid is not None and not w.remote])
    for worker in workers:
        if worker._popen is not None:
            try:
                # A killed kernel shows as a zombie a moment before it can be reaped
                # (its other threads are still exiting); wait so Popen sees the end.
                worker._popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if worker.state != "dead":
            worker.state = "stopped"
        _remove_scratch(worker)


def _remove_scratch(worker: Worker) -> None:
    if worker.connection_file:  # the connection file, log and socket files of a local kernel
        shutil.rmtree(os.path.dirname(worker.connection_file), ignore_errors=True)
