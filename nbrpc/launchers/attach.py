"""Workers started by anything else, joining the driver through its rendezvous service.

Parts:

- ``RemoteWorker``: a ``Worker`` the driver knows through its lifeline (see
  ``rendezvous.Link``) instead of a local pid: alive while the link is, told to
  exit over the link, interrupted over the link.
- ``AttachLauncher``: the driver's side of a cluster whose workers are started
  elsewhere (``nbrpc worker --join`` from a terminal, Slurm, torchrun, Kubernetes;
  ``ssh`` builds on it). It opens the rendezvous, admits each joiner with a unique
  name before it reaches torch (the cluster gives it a rank and the settings),
  connects a kernel client to it, waits for the expected number, and forgets in
  torch any worker it loses, so later joins never wait on a member that is gone.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field

from .._util import kill_pids
from ..errors import DeviceMapError, JoinRefusedError, WorkerStartError
from ..group import devices, membership
from ..settings import check_name
from ..shared_server import scratch
from . import addresses
from .base import Admission, Worker, close_clients, connect, mark_stopped
from .rendezvous import LOST_AFTER, Link, Rendezvous, receive, send

RELEASE_WAIT = 5.0


@dataclass
class RemoteWorker(Worker):
    """A worker kernel on another machine (or started by something else)."""

    link: Link | None = field(default=None, repr=False)
    launcher: object = field(default=None, repr=False)  # the local ssh process, if any

    def alive(self) -> bool:
        return self.link is not None and self.link.lost is None and self.state != "stopped"

    def fate(self) -> str | None:
        if self.alive():
            return None
        why = self.link.lost if self.link is not None and self.link.lost else (
            "was stopped" if self.state == "stopped" else "is not connected")
        return f"(pid {self.pid} on {self.host}, {self.ip}) {why}"

    def interrupt(self) -> None:
        if self.alive():
            self.link.send({"interrupt": True})

    def release(self) -> None:
        """Tell the worker to exit, wait for it to close its end, end its launcher."""
        if self.link is not None:
            if self.link.lost is None and self.link.send({"exit": 0}):
                self.link.wait_closed(RELEASE_WAIT)
            self.link.close()
        if self.launcher is not None:
            kill_pids([self.launcher.pid])
            self.launcher.wait(timeout=5)


class AttachLauncher:
    """Admit workers that join with ``nbrpc worker --join ADDR:PORT --token TOKEN``.

    Parameters
    ----------
    expected
        How many workers ``Cluster.start`` waits for (more may join later).
    names
        Names for workers that join without ``--name``, in order (then worker1, ...).
    bind
        The address (or interface name) to listen on; by default the one that
        routes toward ``toward`` (a worker host), or the default route.
    port
        The rendezvous port (0: a free one).
    """

    # Workers elsewhere may share this machine's GPUs or not: planned from the driver's view.
    own_gpus = False

    def __init__(self, expected: int, names: list[str] | None = None, bind: str | None = None,
                 port: int = 0, toward: str | None = None):
        self.expected, self.names, self.port = expected, list(names or []), int(port)
        self.address, self.interface = addresses.resolve_bind(bind, toward)
        # Hex: a token starting with "-" would read as an option on the printed command line.
        self.token = secrets.token_hex(24)
        self.server: Rendezvous | None = None
        self.closing = False
        self.unfit: list[str] = []  # joiners refused for lacking the GPUs their plan uses
        self._lock = threading.Lock()

    @property
    def command(self) -> str:
        """What to run on each worker machine."""
        port = self.server.port if self.server else self.port
        return f"nbrpc worker --join {self.address}:{port} --token {self.token}"

    def planned(self) -> list[Worker]:
        return []  # workers are listed as they are admitted

    def placement_names(self) -> list[str]:
        # Workers that join take these names, in order, unless they ask for another
        # with --name (that one then runs on CPU).
        return self.names or [f"worker{i}" for i in range(1, self.expected + 1)]

    def prepare(self) -> None:
        pass

    def start(self, cluster: Admission, driver: membership.DriverGroup, deadline: float) -> None:
        """Open the rendezvous, have the workers started, wait for ``expected`` of them."""
        self.cluster, self.driver = cluster, driver
        self.server = Rendezvous(self.address, self.port, self.token, driver.store.port,
                                 self._admit, self._say)
        self._launch()
        self._wait(deadline)

    def close(self) -> None:
        """Refuse new joins."""
        self.closing = True
        if self.server is not None:
            self.server.close()

    def stop(self, workers: list[Worker]) -> None:
        """Tell every worker to exit over its lifeline (its pid is on another machine)."""
        close_clients(workers)
        for worker in workers:
            worker.release()
        mark_stopped(workers)

    # -- what the ssh launcher changes ---------------------------------------------

    def _launch(self) -> None:
        """Say what to run: the workers are started by someone else."""
        print(f"nbrpc: waiting for {self.expected} worker{'s' * (self.expected != 1)}; "
              f"on each worker machine run:\n    {self.command}", flush=True)

    def _check_launched(self) -> None:
        """Raise ``WorkerStartError`` if a worker this launcher started cannot join any more."""

    def _not_joined(self) -> list[str]:
        """Lines naming workers this launcher started that have not joined yet."""
        return []

    def _new_worker(self, name: str, hello: dict, peer: tuple) -> RemoteWorker:
        """The worker a join admits (a launcher may know more about it)."""
        return RemoteWorker(name, 0, host=str(hello.get("host", "?")), ip=peer[0],
                            pid=hello.get("pid"), state="joining")

    def _reserved(self) -> set[str]:
        """Names kept for workers this launcher started, until they join."""
        return set()

    def _claim(self, name: str) -> object:
        """The local process that started worker ``name``, if this launcher started it."""
        return None

    # -- start-up ------------------------------------------------------------------

    def _wait(self, deadline: float) -> None:
        reported = 0
        while True:
            running = [w for w in self.cluster.known_workers() if w.state == "running"]
            for w in running[reported:]:
                self.cluster.progress(len(running), self.expected, f"{w.name} joined from {w.host} ({w.ip})")
            reported = len(running)
            if len(running) >= self.expected:
                return
            self._check_launched()
            if time.monotonic() > deadline:
                raise WorkerStartError(self._failure(
                    f"{len(running)} of {self.expected} workers joined within "
                    f"startup_timeout={self.cluster.startup_timeout:g} s"))
            time.sleep(0.05)

    def _failure(self, what: str) -> str:
        def listing(state):
            return ", ".join(f"{w.name} (pid {w.pid} on {w.host}, {w.ip})"
                             for w in self.cluster.known_workers() if w.state == state) or "none"
        lines = [f"{what}.", f"Joined: {listing('running')}.",
                 f"Admitted, not in RPC yet: {listing('joining')}.", f"Lost: {listing('lost')}.",
                 *self._not_joined()]
        if self.server.refused:
            lines.append("Refused: " + "; ".join(self.server.refused) + ".")
        lines.append(f"Start the missing workers with:\n    {self.command}\n"
                     "or raise startup_timeout (%rpc_init --startup-timeout SECONDS).")
        return "\n".join(lines)

    # -- admission (rendezvous threads) --------------------------------------------

    def _admit(self, sock, peer: tuple, hello: dict) -> None:
        with self._lock:
            if self.closing:
                raise JoinRefusedError("the cluster is shutting down")
            name = self._grant_name(hello.get("name"))
            self._check_gpus(name, hello, peer)
            w = self._new_worker(name, hello, peer)
            w.launcher = self._claim(name)
            settings = self.cluster.admit(w)
        try:
            send(sock, {"ok": True, "name": w.name, "rank": w.rank, "settings": settings.to_wire()})
            sock.settimeout(self.cluster.startup_timeout)
            kernel = receive(sock)["kernel"]
        except (OSError, ConnectionError, KeyError, TypeError):
            sock.close()
            return self._lost(w, "closed its connection before its kernel started")
        w.ip = kernel["ip"]
        w.connection_file = _save_connection(w.name, kernel)
        w.link = Link(sock, LOST_AFTER, on_message=lambda message: None,
                      on_lost=lambda why: self._lost(w, why))
        self._await_member(w)

    def _grant_name(self, requested) -> str:
        taken = {w.name for w in self.cluster.known_workers()} | set(membership.member_names())
        if requested:
            try:
                check_name(requested)
            except ValueError as e:
                raise JoinRefusedError(str(e)) from None
            if requested in taken:
                raise JoinRefusedError(
                    f"the name {requested!r} is taken in this cluster; pass another --name, "
                    "or none to be given one")
            return requested
        reserved = self._reserved()
        for name in self.names:
            if name not in taken and name not in reserved:
                return name
        i = 1
        while f"worker{i}" in taken or f"worker{i}" in self.names:
            i += 1
        return f"worker{i}"

    def _check_gpus(self, name: str, hello: dict, peer: tuple) -> None:
        """Refuse a joiner that lacks the GPUs the cluster's plan gives it (what its
        hello says torch sees there), before it reaches torch."""
        try:
            devices.check_worker(name, f"{hello.get('host', '?')} ({peer[0]})",
                                 self.cluster.placements.get(name), hello.get("gpus"))
        except DeviceMapError as e:
            self.unfit.append(str(e))
            raise JoinRefusedError(str(e)) from None

    def _await_member(self, w: RemoteWorker) -> None:
        """Once the worker is in torch's group, connect to its kernel and mark it running."""
        while w.link.lost is None and not self.closing:
            if w.name in membership.member_names():
                break
            time.sleep(0.05)
        else:
            return
        try:
            connect(w)
            w.client.wait_for_ready(timeout=self.cluster.startup_timeout)
        except RuntimeError as e:
            return self._lost(w, f"joined RPC but its kernel did not answer ({e})")
        if w.state == "joining":
            w.state = "running"
            if self.cluster.state == "running":
                self.cluster.install_devices()  # torch's join leaves reply maps wrong
                self._say(f"{w.name} joined from {w.host} ({w.ip})")

    def _lost(self, w: RemoteWorker, why: str) -> None:
        if self.closing or w.state in ("stopped", "lost"):
            return
        w.state = "lost"
        with self._lock:
            if membership.is_member():
                # Torch's next join would wait on this member (and hold the group's
                # lock for good); its name and rank go, as a graceful leave would.
                self.driver.forget({w.name: w.rank})
        if self.cluster.state == "running":
            self.cluster.install_devices()  # forgetting a member erased every member's maps
        self._say(f"lost worker {w.name!r} {w.fate() or why}")

    def _say(self, text: str) -> None:
        print(f"nbrpc: {text}", file=sys.stderr, flush=True)


def _save_connection(name: str, kernel: dict) -> str:
    """Write a worker's kernel connection info where a kernel client can load it."""
    folder = scratch.make(name)
    path = os.path.join(folder, "kernel.json")
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        json.dump(kernel, f)
    return path
