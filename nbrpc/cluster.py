"""The cluster: this process as the RPC driver (rank 0) plus worker kernels.

``Cluster.start`` joins RPC as the driver (once per process, see ``group``), launches
the worker kernels in parallel and waits until each has joined RPC and answers on the
Jupyter protocol, or fails with the worker's own output. ``run`` executes code on
workers, ``status`` reports on every member, ``shutdown`` ends RPC everywhere and
every worker process. One cluster runs per process at a time (``current()``).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable

import torch.distributed.rpc as rpc
from jupyter_core.utils import ensure_event_loop

from . import attach as attach_mod
from . import calls, devices, execution, group, rrefs, template, tracing, workers
from . import ssh as ssh_mod
from ._util import LOOPBACK, muted_stderr
from .errors import (
    ClusterRunningError,
    NoClusterError,
    UnknownWorkerError,
    WorkerDiedError,
    WorkerStartError,
)
from .workers import Worker

__all__ = ["Cluster", "current", "start"]

_NAME = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")
_current: Cluster | None = None

Progress = Callable[[int, int, str], None]


def current() -> Cluster | None:
    """The running cluster of this process, or None."""
    return _current


def start(n: int | None = None, **options) -> Cluster:
    """Start a cluster (``Cluster(n, **options).start()``) and return it."""
    return Cluster(n, **options).start()


def text_progress(done: int, total: int, message: str) -> None:
    """Default start-up progress for scripts and terminals."""
    print(f"nbrpc: {message} ({done}/{total})", file=sys.stderr, flush=True)


class Cluster:
    """A driver (this process, rank 0) and worker kernels in one torch RPC group.

    Parameters
    ----------
    n
        Number of workers, named ``worker1`` ... ``workerN`` (default 2).
    names
        Worker names instead of ``n``.
    driver_name
        The RPC name of this process (default: the name it took for an earlier
        cluster, which it keeps until it exits, else ``master``).
    threads
        TensorPipe worker threads per member (``num_worker_threads``).
    timeout
        Default RPC timeout in seconds (``rpc_timeout``).
    startup_timeout
        Seconds to wait for every worker to join before giving up.
    env
        Extra environment variables for the worker processes.
    track
        Record RRef creation, forks, fetches and deletes in every member, for
        ``nbrpc.rref_snapshot()`` and the RRef graph (a few microseconds per RRef).
    trace
        Record every RPC in every member (bounded per member), for
        ``nbrpc.trace_snapshot()`` and the timeline; without it, record blocks with
        ``with nbrpc.trace() as t:``.
    attach
        Wait for this many workers started elsewhere with ``nbrpc worker --join``
        (the command, with its token, is printed and in ``join_command``); more
        may join later. ``names`` then names the workers that join without --name.
    bind, port
        Where the driver listens for workers on other machines: an address of this
        machine or an interface name (default: the one that routes toward the first
        SSH host, or the default route), and a port (default: a free one).
    hosts
        Start workers over SSH: ``"hostA,hostB:2"`` (two on hostB), joining as above.
    ssh
        The ssh command to run (e.g. ``"ssh -F my_config"``); ``python`` is the
        interpreter on the hosts (default: this one's path).
    transport
        TensorPipe's transport in every member: ``"uv"`` (TCP, idle at no CPU) or
        ``"shm"`` (torch's default: shared memory, a little faster per small call, but
        a polling thread keeps a core busy in every member, also at rest). Default:
        the one this process joined with for an earlier cluster (fixed until it
        exits), else ``"uv"``.
    warm_start
        Fork local workers from a warm template process that has imported torch
        and ipykernel once (default: on, unless ``NBRPC_WARM_START=0``); off, each
        worker is a fresh Python.
    """

    def __init__(
        self,
        n: int | None = None,
        *,
        names: Iterable[str] | None = None,
        driver_name: str | None = None,
        threads: int = 16,
        timeout: float = 60.0,
        startup_timeout: float = 60.0,
        env: dict[str, str] | None = None,
        progress: Progress | None = text_progress,
        track: bool = True,
        trace: bool = False,
        attach: int | None = None,
        bind: str | None = None,
        port: int = 0,
        hosts: str | Iterable[str] | None = None,
        ssh: str = "ssh",
        python: str | None = None,
        gpus: bool = False,
        device_maps: dict | str | None = None,
        transport: str | None = None,
        warm_start: bool | None = None,
    ):
        # torch binds RRefs to the first agent, so the driver keeps its first name.
        self._kept_name = driver_name is None and group.driver_name() is not None
        driver_name = driver_name if driver_name is not None else group.driver_name() or "master"
        self._remote = _remote(n, names, driver_name, attach, bind, port, hosts, ssh, python)
        worker_names = [] if self._remote else _worker_names(n, names)
        if not self._remote:
            _check_names(worker_names, driver_name)
        for label, value in (("threads", threads), ("timeout", timeout),
                             ("startup_timeout", startup_timeout)):
            if not value > 0:
                raise ValueError(f"{label} must be a positive number, got {value!r}")
        if transport is not None and transport not in group.TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(map(repr, group.TRANSPORTS))}, "
                             f"got {transport!r}")
        self.transport = transport or group.driver_transport() or "uv"
        self.driver_name = driver_name
        self.threads, self.timeout, self.startup_timeout = int(threads), float(timeout), float(startup_timeout)
        self.env = dict(env or {})
        self.track = bool(track)
        self.trace = bool(trace)
        self.warm_start = template.enabled(warm_start)
        self.progress = progress or (lambda done, total, message: None)
        self._workers = [Worker(name, rank) for rank, name in enumerate(worker_names, 1)]
        self.placements = _placements(driver_name, worker_names, self._remote, gpus, device_maps)
        self.gpus = bool(gpus)
        self._driver = self._store = None
        self.state = "new"

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> Cluster:
        """Bring the RPC group up; raise ``WorkerStartError`` if a worker cannot join."""
        global _current
        if _current is not None:
            raise ClusterRunningError(
                f"a cluster is already running in this process ({_current!r}); "
                "shut it down first (%rpc_shutdown or cluster.shutdown())"
            )
        began = time.monotonic()
        if self.warm_start and not self._remote:
            template.prestart()  # it imports torch while the driver joins RPC
        driver = group.driver_group(self.driver_name, self.threads, self.timeout, self.startup_timeout,
                                    self._remote.interface if self._remote else "lo",
                                    self._driver_placement(), self.transport)
        self._driver, self._store = driver, driver.store
        rrefs.install(self.track)
        tracing.install(self.trace)
        for w, rank in zip(self._workers, driver.take_ranks(len(self._workers))):
            w.rank = rank
        _current, self.state = self, "starting"
        atexit.register(self.shutdown)
        calls.set_worker_fate(self._fate)
        try:
            if self._remote:
                self._remote.start(self, driver, began + self.startup_timeout)
            else:
                self._launch_all(driver.prefix)
                self._await_joined(began + self.startup_timeout)
            self.install_devices()
        except BaseException:
            self._abort()
            raise
        self.state = "running"
        kept = f" ({self.driver_name!r} kept from an earlier cluster)" if self._kept_name else ""
        self.progress(len(self._workers), len(self._workers),
                      f"{self._summary()} up in {time.monotonic() - began:.1f} s{kept}")
        return self

    def shutdown(self) -> None:
        """End RPC in every member and every worker process (safe to call twice)."""
        global _current
        if self.state in ("new", "stopped"):
            return
        atexit.unregister(self.shutdown)
        if self._remote:
            self._remote.close()
        # A frozen (stopped) worker would hold up every graceful leave until timeout.
        everyone_alive = all(w.alive() and not w.stopped() for w in self._workers) and self.state == "running"
        self.state = "stopping"  # live widgets stop refreshing now, not mid-leave
        try:
            with muted_stderr():
                try:
                    # A graceful leave waits for every call still awaited (one the user
                    # interrupted may run for minutes); the workers end either way.
                    if everyone_alive and _calls_drained(within=2.0):
                        self._leave_gracefully()
                finally:
                    workers.stop(self._workers)
                    self._forget_workers()
        finally:
            self._store = None
            self.state = "stopped"
            calls.set_worker_fate(None)
            if _current is self:
                _current = None

    def __enter__(self) -> Cluster:
        return self.start() if self.state == "new" else self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- use ---------------------------------------------------------------------

    @property
    def workers(self) -> list[Worker]:
        """The worker kernels (name, rank, host, pid, state), with fresh states."""
        self._refresh_states()
        return list(self._workers)

    @property
    def join_command(self) -> str | None:
        """The command that joins a worker to this cluster (clusters with ``attach``/``hosts``)."""
        return self._remote.command if self._remote else None

    def worker(self, name: str) -> Worker:
        for w in self._workers:
            if w.name == name:
                return w
        known = ", ".join(w.name for w in self._workers)
        raise UnknownWorkerError(f"no worker named {name!r}; the workers are: {known} (or 'all')")

    def run(self, code: str, targets: str | Iterable[str] = "all",
            output: execution.Output | None = None) -> None:
        """Execute ``code`` on the ``targets`` kernels (what ``%%rpc_on`` does)."""
        self._require_running()
        chosen = self.select(targets)
        for w in chosen:
            if w.state == "joining":
                raise WorkerStartError(f"worker {w.name!r} is still joining; run the cell again in a moment")
            fate = w.fate()
            if fate:
                raise WorkerDiedError(
                    f"worker {w.name!r} {fate}; run on the others, or restart the cluster "
                    "(%rpc_shutdown, then %rpc_init)"
                )
        execution.run(code, chosen, output or execution.PrintOutput())

    def select(self, targets: str | Iterable[str]) -> list[Worker]:
        """Workers named by ``"all"``, ``"a,b"`` or a list of names."""
        if isinstance(targets, str):
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        targets = list(targets)
        if targets == ["all"]:
            return list(self._workers)
        if not targets:
            raise UnknownWorkerError("no target worker given; name one, several (a,b) or 'all'")
        return [self.worker(name) for name in dict.fromkeys(targets)]

    def status(self) -> list[dict]:
        """One row per member: name, rank, host, pid, state, devices, busy, owned_rrefs."""
        self._refresh_states()
        rows = [dict(name=self.driver_name, rank=0, host=socket.gethostname(),
                     pid=os.getpid(), state=self.state if self.state != "running" else "driver",
                     devices=self._devices_label(self.driver_name),
                     **(_debug_counts(local=True) if group.is_member() else _no_counts()))]
        futures = {}
        for w in self._workers:
            if w.state == "running":
                futures[w.name] = rpc.rpc_async(w.name, _debug_counts, timeout=5)
        for w in self._workers:
            counts = _no_counts()
            if w.name in futures:
                try:
                    counts = futures[w.name].wait()
                except (RuntimeError, TimeoutError):
                    counts = _no_counts()
            rows.append(dict(name=w.name, rank=w.rank, host=w.host, pid=w.pid, state=w.state,
                             devices=self._devices_label(w.name), **counts))
        return rows

    def __repr__(self) -> str:
        return f"<nbrpc.Cluster {self.state}: {self._summary()}>"

    def install_devices(self) -> None:
        """Give every member the devices and reply maps of this cluster's plan.

        torch's dynamic joins leave earlier members without reply maps toward later
        ones, and every leave erases them (see ``devices.install``); a CPU cluster
        has nothing to install.
        """
        if not self.placements:
            return
        for name in [self.driver_name, *(w.name for w in self._workers if w.state in ("joining", "running"))]:
            replies = devices.reverse_maps(self.placements, name)
            if name == self.driver_name:
                # The driver keeps the devices it joined with (all visible GPUs).
                devices.install(list(self._driver.placement.devices), replies)
            elif name in group.member_names():
                own = list(self.placements.get(name, devices.CPU).devices)
                rpc.rpc_sync(name, devices.install, args=(own, replies), timeout=self.timeout)

    def _driver_placement(self) -> devices.Placement | None:
        placement = self.placements.get(self.driver_name)
        # Used only if this is the kernel's first join, which fixes the driver's maps.
        return devices.reaching_default_workers(placement) if self.gpus and placement else placement

    def _devices_label(self, name: str) -> str:
        if name == self.driver_name and self._driver is not None:
            return self._driver.placement.label()
        return self.placements.get(name, devices.CPU).label()

    # -- internals ---------------------------------------------------------------

    def _summary(self) -> str:
        return f"{self.driver_name} + " + ", ".join(w.name for w in self._workers)

    def _fate(self, name: str) -> str | None:
        for w in self._workers:
            if w.name == name:
                fate = w.fate()
                if fate and w.state not in ("stopped", "lost"):
                    w.state = "dead"
                return fate
        return None

    def _refresh_states(self) -> None:
        for w in self._workers:
            if w.state in ("running", "starting") and not w.alive() and w.pid is not None:
                w.state = "dead"

    def _require_running(self) -> None:
        if self.state != "running":
            raise NoClusterError(f"the cluster is {self.state}; start one with %rpc_init or nbrpc.start()")

    def _launch_all(self, prefix: str) -> None:
        host, port = LOOPBACK, self._store.port
        total = len(self._workers)
        self.progress(0, total, f"starting {total} worker kernel{'s' * (total > 1)}")
        for w in self._workers:
            workers.launch(w, {**self._worker_env(w, prefix), "NBRPC_STORE": f"{host}:{port}"}, os.getcwd(),
                           warm_start=self.warm_start)

    def _worker_env(self, w: Worker, prefix: str) -> dict[str, str]:
        """Every setting a worker reads at start (workers joining from elsewhere get
        these too, except the ones about this machine: store, driver pid, interface)."""
        return {
            **self.env,
            "NBRPC_PREFIX": prefix,
            "NBRPC_NAME": w.name, "NBRPC_RANK": str(w.rank),
            "NBRPC_THREADS": str(self.threads), "NBRPC_TIMEOUT": str(self.timeout),
            "NBRPC_DRIVER_PID": str(os.getpid()), "NBRPC_INTERFACE": "lo",
            "NBRPC_TRACK": "1" if self.track else "0",
            "NBRPC_TRACE": "1" if self.trace else "0",
            "NBRPC_KEY": self._driver.key.hex(),
            "NBRPC_TRANSPORT": self.transport,
            **devices.to_settings(self.placements.get(w.name)),
        }

    def _await_joined(self, deadline: float) -> None:
        waiting, total = list(self._workers), len(self._workers)
        # Each kernel's readiness check (kernel_info, then IOPub) runs as soon as it
        # joined, alongside the others, not one after another.
        ready: dict[str, threading.Thread] = {}
        failed: dict[str, RuntimeError] = {}
        cancel = threading.Event()

        def wait_ready(w: Worker) -> None:
            try:
                workers.wait_ready(w.client, max(1.0, deadline - time.monotonic()), cancel)
            except RuntimeError as e:
                failed[w.name] = e
            finally:  # the event loop jupyter-client made for this thread
                asyncio.set_event_loop(None)
                ensure_event_loop().close()

        try:
            while waiting:
                members = set(group.member_names())
                for w in list(waiting):
                    if w.name in members:
                        waiting.remove(w)
                        workers.connect(w)
                        ready[w.name] = threading.Thread(target=wait_ready, args=(w,), daemon=True,
                                                         name=f"nbrpc-ready-{w.name}")
                        ready[w.name].start()
                        self.progress(total - len(waiting), total, f"{w.name} joined")
                    elif not w.alive():
                        raise WorkerStartError(self._start_failure(w, f"exited before joining ({w.fate()})"))
                if waiting and time.monotonic() > deadline:
                    raise WorkerStartError(self._start_failure(
                        waiting[0], f"did not join within startup_timeout={self.startup_timeout:g} s"))
                time.sleep(0.02)
        except BaseException:
            cancel.set()  # another worker failed: do not wait out these checks
            raise
        finally:
            for thread in ready.values():  # no client is in use by two threads at once
                thread.join()
        for w in self._workers:
            if w.name in failed:
                raise WorkerStartError(self._start_failure(w, f"kernel did not answer: {failed[w.name]}")) \
                    from failed[w.name]
            w.state = "running"

    def _start_failure(self, w: Worker, what: str) -> str:
        tail = w.log_tail().strip() or "(no output)"
        return (
            f"worker {w.name!r} (pid {w.pid}) {what}. Its output:\n{tail}\n"
            "Fix the cause above (a package missing from this environment, a crash at import, "
            "a machine out of memory), or raise startup_timeout / %rpc_init --startup-timeout."
        )

    def _leave_gracefully(self) -> None:
        """Each worker leaves the group in turn (torch's membership lock orders them)."""
        ready = [w for w in self._workers if w.client is not None]
        pending = {w.client.execute("import nbrpc.worker; nbrpc.worker.leave()", silent=True): w
                   for w in ready}
        deadline = time.monotonic() + min(self.timeout, 20.0)
        for w in ready:
            while pending and time.monotonic() < deadline and w.alive():
                try:
                    reply = w.client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
                except Exception:
                    break
                if pending.pop(reply["parent_header"].get("msg_id"), None) is w:
                    break

    def _forget_workers(self) -> None:
        """Drop workers that did not leave (killed, crashed) from the driver's group."""
        if group.is_member():
            self._driver.forget({w.name: w.rank for w in self._workers})

    def _abort(self) -> None:
        """Undo a start that failed: nothing may survive it."""
        self.state = "failed"
        self.shutdown()


def _remote(n, names, driver_name, attach, bind, port, hosts, ssh, python) -> attach_mod.Attach | None:
    """The launcher for workers on other machines, or None for local workers."""
    if attach is None and hosts is None:
        if bind is not None or port:
            raise ValueError("bind and port are for workers on other machines: add attach=N or hosts=...")
        return None
    if attach is not None and hosts is not None:
        raise ValueError("give attach=N (workers started elsewhere) or hosts=... (started over SSH), not both")
    if n is not None:
        raise ValueError("n is for local workers; with attach or hosts the count comes from them")
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be a number from 0 (a free one) to 65535, got {port!r}")
    listed = [x.strip() for x in names.split(",") if x.strip()] if isinstance(names, str) else list(names or [])
    if hosts is not None:
        hosts = ssh_mod.parse_hosts(hosts)
        listed = listed or [f"worker{i}" for i in range(1, len(hosts) + 1)]
        if len(listed) != len(hosts):
            raise ValueError(f"{len(hosts)} SSH workers but {len(listed)} names; give one name per worker")
        attach = len(hosts)
    elif isinstance(attach, bool) or not isinstance(attach, int) or attach < 0:
        raise ValueError(f"attach must be the number of workers to wait for (>= 0), got {attach!r}")
    if listed:
        _check_names(listed, driver_name)
    return attach_mod.Attach(attach, listed, bind, port, hosts, ssh, python)


def _placements(driver_name, worker_names, remote, gpus, device_maps) -> dict[str, devices.Placement]:
    """Each member's devices and maps, checked before any process starts."""
    if not gpus and not device_maps:
        return {}
    if remote is not None and not worker_names:
        # Workers that join from elsewhere take these names, in order, unless they
        # ask for another with --name (that one then runs on CPU).
        worker_names = remote.names or [f"worker{i}" for i in range(1, remote.expected + 1)]
    placements = devices.plan([driver_name, *worker_names], devices.visible_gpus(), bool(gpus), device_maps)
    group.check_placement(placements.get(driver_name))
    return placements


def _worker_names(n: int | None, names: Iterable[str] | None) -> list[str]:
    if names is not None:
        if isinstance(names, str):
            names = [x.strip() for x in names.split(",") if x.strip()]
        names = list(names)
        if n is not None and n != len(names):
            raise ValueError(f"n={n} but {len(names)} names given; give one or the other")
        return names
    n = 2 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the number of workers must be a whole number >= 1, got {n!r}")
    return [f"worker{i}" for i in range(1, n + 1)]


def _check_names(names: list[str], driver_name: str) -> None:
    if not names:
        raise ValueError("a cluster needs at least one worker name")
    for name in [*names, driver_name]:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"invalid worker name {name!r}: use letters, digits, '_', ':' or '-' "
                "(1 to 127 characters), as torch RPC requires"
            )
    everyone = [*names, driver_name]
    duplicates = sorted({x for x in everyone if everyone.count(x) > 1})
    if duplicates:
        raise ValueError(f"worker names must be unique; repeated: {', '.join(duplicates)}")


def _calls_drained(within: float) -> bool:
    """Wait briefly for this process's outstanding RPCs (RRef deletes just sent, say)."""
    deadline = time.monotonic() + within
    while group.calls_in_flight():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _no_counts() -> dict:
    return {"busy": None, "owned_rrefs": None}


def _debug_counts(local: bool = False) -> dict:
    """Busy RPC threads and owned RRefs of this member, from torch's debug info."""
    info = rpc._get_debug_info()
    busy = int(info["agent.thread_pool_size"]) - int(info["agent.num_idle_threads"])
    # Asked over RPC, one busy thread is the one answering.
    return {"busy": busy - (0 if local else 1), "owned_rrefs": int(info["num_owner_rrefs"])}
