"""What a launcher is, and the worker it starts.

Parts:

- ``Worker``: one worker kernel as the driver knows it (its RPC name and rank, where
  it runs, its Jupyter client). Each launcher's subclass says whether its process is
  alive, interrupts it, and says why it is gone (``fate``).
- ``Launcher``: the protocol ``Cluster`` holds one of. It starts workers toward the
  driver's group, ends them, and refuses new ones at shutdown.
- ``Admission``: the cluster as its launcher sees it. ``admit`` gives a worker its
  rank and settings and lists it in the cluster: every worker, started here or
  joining later from elsewhere, is reported through it.
- Kernel files and clients shared by every launcher: ``write_unbound_connection_file``,
  ``connect``, ``close_clients``, ``mark_stopped``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from jupyter_client import BlockingKernelClient

from .._util import LOOPBACK

if TYPE_CHECKING:
    from ..group.devices import Placement
    from ..group.membership import DriverGroup
    from ..settings import WorkerSettings

Progress = Callable[[int, int, str], None]


class Started(str):
    """The last message a ``Progress`` gets: the cluster is up (its text says in how long)."""


@dataclass
class Worker:
    """One worker kernel: its RPC identity, where it runs and its Jupyter client."""

    name: str
    rank: int
    host: str = field(default_factory=socket.gethostname)
    ip: str = LOOPBACK
    pid: int | None = None
    state: str = "starting"
    connection_file: str = ""
    client: BlockingKernelClient | None = field(default=None, repr=False)
    job: str | None = None  # the batch job it runs in (Slurm: "4321", or "4321.2" for a step)

    def alive(self) -> bool:
        raise NotImplementedError

    def stopped(self) -> bool:
        """True while the process is frozen (SIGSTOP): alive, but it answers nothing."""
        return False

    def interrupt(self) -> None:
        """Interrupt the code the kernel is running (what the stop button does)."""
        raise NotImplementedError

    def fate(self) -> str | None:
        """Why this worker is gone, or None while it runs."""
        raise NotImplementedError


class Admission(Protocol):
    """What a launcher may ask of the cluster it starts workers for."""

    startup_timeout: float
    state: str
    progress: Progress
    placements: dict[str, Placement]  # each member's devices and maps ({} on CPU)

    def admit(self, worker: Worker) -> WorkerSettings:
        """Give ``worker`` the next rank, list it, and return the settings it starts with."""

    def known_workers(self) -> list[Worker]:
        """Every worker listed so far, in the order they were admitted."""

    def install_devices(self) -> None:
        """Put the cluster's device maps into every member (after a join or a loss)."""


class Launcher(Protocol):
    """One way of starting workers (``local``, ``attach``, ``ssh``, ``slurm``, or a third
    party's, registered as a ``registry.Kind``)."""

    #: Where the driver's TensorPipe listener goes so that these workers reach it.
    interface: str
    #: The command that joins a worker started elsewhere, or None.
    command: str | None
    #: True where workers run with GPUs of their own (a Slurm task's), not this machine's.
    own_gpus: bool

    def planned(self) -> list[Worker]:
        """The workers known before the start (the cluster lists them from its creation)."""

    def placement_names(self) -> list[str]:
        """The worker names that get GPUs and device maps, in order."""

    def prepare(self) -> None:
        """Work that can overlap the driver's own join (warming a template)."""

    def start(self, cluster: Admission, driver: DriverGroup, deadline: float) -> None:
        """Start the workers toward ``driver``'s group; return once the expected ones run,
        or raise ``WorkerStartError`` naming what went wrong."""

    def close(self) -> None:
        """Refuse new workers (the first step of a shutdown)."""

    def stop(self, workers: list[Worker]) -> None:
        """End every one of ``workers``; each ends ``stopped`` unless it was ``dead``."""


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


def close_clients(workers: list[Worker]) -> None:
    for worker in workers:
        if worker.client is not None:
            worker.client.stop_channels()
            worker.client = None


def mark_stopped(workers: list[Worker]) -> None:
    """After their processes ended: ``stopped`` (unless ``dead``), their files removed."""
    for worker in workers:
        if worker.state != "dead":
            worker.state = "stopped"
        if worker.connection_file:  # the connection file (and a local kernel's log and sockets)
            shutil.rmtree(os.path.dirname(worker.connection_file), ignore_errors=True)
