"""The cluster: this process as the RPC driver (rank 0) plus worker kernels.

``Cluster.start`` joins RPC as the driver (once per process, see ``membership``) and has its
launcher (``launchers``: local kernels, workers that attach, SSH) start the workers;
each one is admitted here (``admit``: its rank and settings). ``run`` executes code on
workers, ``status`` reports on every member, ``shutdown`` ends RPC everywhere and
every worker process. One cluster runs per process at a time (``current()``).
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable

import torch.distributed.rpc as rpc

from .._util import muted_stderr
from ..calls import failures, serving
from ..calls.output import PrintOutput
from ..diagnostics import trace
from ..errors import ClusterRunningError, NoClusterError, UnknownWorkerError, WorkerDiedError, WorkerStartError
from ..group import DEFAULT_TRANSPORT, devices, membership
from ..launchers import registry, template
from ..launchers.base import Progress, Started, Worker
from ..recording.pending import PENDING
from ..settings import WorkerSettings, shared_tensors_min_bytes, shared_tensors_wanted
from ..shared_server import limits, private_network
from ..wire import shared_tensors
from . import counts, execution
from .cluster_options import DEFAULTS, ClusterOptions
from .control import Probes
from .queries import Queries

__all__ = ["Cluster", "current"]

_current: Cluster | None = None


def current() -> Cluster | None:
    """The running cluster of this process, or None."""
    return _current


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
        TensorPipe worker threads per member (``num_worker_threads``; default 16, or the server's).
    timeout
        Default RPC timeout in seconds (``rpc_timeout``; default 60, at most the server's
        limit). Over a limit of the server's (``limits``), ``LimitError`` names it.
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
    attach, bind, port, hosts, ssh, python, slurm
        Where the workers come from (default: local kernels): the options of the launcher
        they ask for (``launchers.options``), read by ``registry.choose``.
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
        TensorPipe's transport in every member: ``"uv"`` (TCP, idle at no CPU: the default) or
        ``"shm"`` (torch's default: shared memory, a little faster per small call, but
        a polling thread keeps a core busy in every member, also at rest). Default:
        the one this process joined with for an earlier cluster (fixed until it
        exits), else ``membership.DEFAULT_TRANSPORT``.
    slurm
        Start the workers in a Slurm job (one task each; inside an allocation, a step of
        it): ``True``, or the job's options as a dict or ``nbrpc.SlurmOptions``
        (partition, time_limit, account, nodes, tasks_per_node, cpus_per_task,
        gpus_per_task, args, queue_timeout). ``bind`` and ``port`` apply as for attach.
    torch_threads_only
        Serve every call on torch's own RPC threads in every member, as torch does (its
        thread-pool deadlock included, for teaching it); default: nbrpc hands calls that
        would take the last threads to threads of its own (``calls.serving``).
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
        threads: int | None = None,
        timeout: float | None = None,
        startup_timeout: float = DEFAULTS.startup_timeout,
        env: dict[str, str] | None = None,
        progress: Progress | None = text_progress,
        track: bool = True,
        trace: bool = False,
        gpus: bool = False,
        device_maps: dict | str | None = None,
        transport: str | None = None,
        warm_start: bool | None = None,
        torch_threads_only: bool = False,
        **where,
    ):
        # torch binds RRefs to the first agent, so the driver keeps its first name.
        self._kept_name = driver_name is None and membership.driver_name() is not None
        driver_name = driver_name if driver_name is not None else membership.driver_name() or "master"
        self.warm_start = template.enabled(warm_start)
        self.limits = limits.load()  # the server's: default threads, longest timeout, most workers
        threads, timeout = self.limits.apply(threads, timeout, DEFAULTS.threads, DEFAULTS.timeout)
        own = ClusterOptions(threads, timeout, startup_timeout, transport, bool(torch_threads_only))
        self.launcher = registry.choose(registry.Request(n, names, driver_name, self.warm_start, bool(gpus)),
                                         **where)
        if isinstance(self.launcher, registry.LocalLauncher):
            self.limits.check_workers(len(self.launcher.planned()), limits.local_workers())
        self.shared_tensors = isinstance(self.launcher, registry.LocalLauncher) and shared_tensors_wanted()
        self.shared_tensors_min_bytes = shared_tensors_min_bytes()
        self.transport = own.transport or membership.driver_transport() or DEFAULT_TRANSPORT
        self.driver_name = driver_name
        self.threads, self.timeout, self.startup_timeout = int(threads), float(timeout), float(startup_timeout)
        self.env = dict(env or {})
        self.track, self.trace = bool(track), bool(trace)
        self.torch_threads_only = own.torch_threads_only
        self.progress = progress or (lambda done, total, message: None)
        self._workers = self.launcher.planned()
        self._admitting = threading.Lock()
        self.probes = Probes()  # the side channel nbrpc.waits() and stacks() ask
        self.queries = Queries(driver_name, self.threads, lambda: self.workers, lambda: self.state == "running",
                               self.probes)
        self.placements = _placements(driver_name, self.launcher.placement_names(), gpus, device_maps,
                                      self.launcher.own_gpus)
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
        self.launcher.prepare()
        driver = private_network.NETWORK.join_as_driver(functools.partial(
            membership.driver_group, self.driver_name, self.threads, self.timeout, self.startup_timeout,
            self.launcher.interface, self._driver_placement(), self.transport, track=self.track, trace=self.trace),
            first=membership.driver_name() is None, local=isinstance(self.launcher, registry.LocalLauncher))
        self._driver, self._store = driver, driver.store
        _current, self.state = self, "starting"
        atexit.register(self.shutdown)
        failures.WORKER_FATES.add(self._fate)
        trace.CLUSTER_TRACES.add(self._traces)
        PENDING.explainers.add(self.queries.explain)
        try:
            self.launcher.start(self, driver, began + self.startup_timeout)
            self.install_devices()
        except BaseException:
            self._abort()
            raise
        self.state = "running"
        shared_tensors.enable(self.shared_tensors, self.shared_tensors_min_bytes)
        if self.torch_threads_only:
            self.serve_on_torch_threads(True, with_driver=True)
        kept = f" ({self.driver_name!r} kept from an earlier cluster)" if self._kept_name else ""
        self.progress(len(self._workers), len(self._workers),
                      Started(f"{self._summary()} up in {time.monotonic() - began:.1f} s{kept}"))
        return self

    def shutdown(self) -> None:
        """End RPC in every member and every worker process (safe to call twice)."""
        global _current
        if self.state in ("new", "stopped"):
            return
        atexit.unregister(self.shutdown)
        self.launcher.close()
        # A frozen (stopped) worker would hold up every graceful leave until timeout.
        everyone_alive = all(w.alive() and not w.stopped() for w in self._workers) and self.state == "running"
        self.state = "stopping"  # live widgets stop refreshing now, not mid-leave
        try:
            with muted_stderr(until_closed=lambda: [w.pid for w in self._workers if w.pid]):
                try:
                    # A graceful leave waits for every call still awaited (one the user
                    # interrupted may run for minutes); the workers end either way.
                    if everyone_alive and membership.calls_drained(within=2.0):
                        self._leave_gracefully()
                finally:
                    membership.close_connections_at_their_end(w.name for w in self._workers)
                    self.launcher.stop(self._workers)
                    self._forget_workers()
        finally:
            shared_tensors.enable(False)
            serving.serve_on_torch_threads(False)  # the driver outlives the cluster
            self._store, self.state = None, "stopped"
            failures.WORKER_FATES.discard(self._fate)
            trace.CLUSTER_TRACES.discard(self._traces)
            PENDING.explainers.discard(self.queries.explain)
            PENDING.forget_calls_to(w.name for w in self._workers)
            self.probes.close()
            if _current is self:
                _current = None

    def _traces(self) -> bool:
        """Whether this cluster records every call (``nbrpc.trace_snapshot``)."""
        return self.trace

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
        return self.launcher.command

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
        # In flight while the cells run: a stuck one is diagnosed as a stuck call is.
        keys = [PENDING.calling(w.name, "the %%rpc_on cell", None, "rpc_on", site=False) for w in chosen]
        try:
            execution.run(code, chosen, output or PrintOutput())
        finally:
            for key in keys:
                PENDING.answered(key)

    def serve_on_torch_threads(self, on: bool = True, targets: str | Iterable[str] = "all",
                               with_driver: bool = False) -> None:
        """Have the ``targets`` workers (and the driver, ``with_driver``) serve every call on
        torch's own RPC threads, as torch does, so that functions that block on other calls can
        take every thread (torch's thread-pool deadlock, as a lesson shows it); ``on=False``:
        nbrpc's hand-off again. ``torch_threads_only=True`` at start does it for every member.
        Told through each worker's kernel, which answers while its RPC threads are all taken."""
        self.run(f"import nbrpc.calls.serving; nbrpc.calls.serving.serve_on_torch_threads({bool(on)})",
                 targets)
        if with_driver:
            serving.serve_on_torch_threads(on)

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
                     devices=self._devices_label(self.driver_name), **counts.own())]
        asked = counts.of_workers([w.name for w in self._workers if w.state == "running"])
        for w in self._workers:
            rows.append(dict(name=w.name, rank=w.rank, host=w.host, pid=w.pid, state=w.state,
                             devices=self._devices_label(w.name), **asked.get(w.name, counts.NONE),
                             **({"job": w.job} if w.job else {})))
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
            elif name in membership.member_names():
                own = list(self.placements.get(name, devices.CPU).devices)
                rpc.rpc_sync(name, devices.install, args=(own, replies), timeout=self.timeout)

    def _driver_placement(self) -> devices.Placement | None:
        placement = self.placements.get(self.driver_name)
        # Used only if this is the kernel's first join, which fixes the driver's maps.
        if self.gpus and placement:
            return devices.reaching_default_workers(placement, self.launcher.own_gpus)
        return placement

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

    def admit(self, worker: Worker) -> WorkerSettings:
        """Give ``worker`` the next rank, list it, and return the settings it starts with
        (what every launcher calls, for the workers it starts and for later joins)."""
        with self._admitting:
            worker.rank = self._driver.take_ranks(1)[0]
            if not any(w is worker for w in self._workers):
                self._workers.append(worker)
        return self._settings(worker)

    def known_workers(self) -> list[Worker]:
        """Every worker listed so far, states as they were last seen."""
        return list(self._workers)

    def _settings(self, w: Worker) -> WorkerSettings:
        """What worker ``w`` starts with (a local launcher adds where the store is)."""
        return WorkerSettings(
            name=w.name, rank=w.rank, prefix=self._driver.prefix, key=self._driver.key, threads=self.threads,
            timeout=self.timeout, track=self.track, trace=self.trace, shared_tensors=self.shared_tensors,
            shared_tensors_min_bytes=self.shared_tensors_min_bytes,
            transport=self.transport, placement=self.placements.get(w.name), env=dict(self.env),
        )

    def _leave_gracefully(self) -> None:
        """Every member deletes its RRefs and lets its calls end at once (``release_rrefs``,
        ``worker.leave_together``), not one torch graceful leave after another (O(n^2))."""
        ready = [w for w in self._workers if w.client is not None]
        code = "import nbrpc.member.worker; nbrpc.member.worker.leave_together()"
        pending = {w.client.execute(code, silent=True): w for w in ready}
        membership.release_rrefs()  # while the workers release theirs
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
        if membership.is_member():
            self._driver.forget({w.name: w.rank for w in self._workers})

    def _abort(self) -> None:
        """Undo a start that failed: nothing may survive it."""
        self.state = "failed"
        self.shutdown()


def _placements(driver_name, worker_names, gpus, device_maps, own_gpus) -> dict[str, devices.Placement]:
    """Each member's devices and maps, checked before any process starts (a worker with
    GPUs of its own is checked again when it joins)."""
    if not gpus and not device_maps:
        return {}
    placements = devices.plan([driver_name, *worker_names], devices.visible_gpus(), bool(gpus), device_maps,
                              own_gpus)
    membership.check_placement(placements.get(driver_name))
    return placements
