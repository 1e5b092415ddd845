"""Ways of starting workers, one module each, behind one small protocol (``base.Launcher``).

- ``local``: worker kernels on this machine (the default), all sockets on loopback.
- ``attach``: workers started by anything else with ``nbrpc worker --join``.
- ``ssh``: worker kernels on other hosts started over SSH, joining as ``attach``'s do.
- ``slurm``: workers as the tasks of a Slurm job (or a step of the current
  allocation), joining as ``attach``'s do.

``rendezvous`` (the driver's join service and the worker's side of it) and
``addresses`` (which local address reaches the workers) serve the last two.
``choose`` reads a cluster's options and returns the launcher they ask for.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..settings import check_name
from .attach import AttachLauncher
from .base import Admission, Launcher, Worker
from .local import LocalLauncher
from .slurm import SlurmLauncher, SlurmOptions
from .ssh import SshLauncher, parse_hosts

__all__ = ["Admission", "Launcher", "Worker", "choose"]


def choose(n: int | None, names, driver_name: str, warm_start: bool, gpus: bool = False, *,
           attach: int | None = None, bind: str | None = None, port: int = 0, hosts=None, ssh: str = "ssh",
           python: str | None = None, slurm=None, **unknown) -> Launcher:
    """The launcher a cluster's options ask for (the options of every launcher are
    here, not in ``Cluster``), checked before anything starts; ``gpus``: the cluster's
    ``--gpus`` (a Slurm job then asks for one GPU per task unless told otherwise)."""
    if unknown:
        raise TypeError(f"Cluster() got unexpected options {', '.join(map(repr, sorted(unknown)))}; "
                        "workers come from local kernels, attach=N, hosts=... (with bind, port, ssh, "
                        "python) or slurm=True")
    slurm = SlurmOptions.from_value(slurm)
    if slurm is not None:
        if attach is not None or hosts is not None:
            raise ValueError("give slurm (workers in a Slurm job), attach=N or hosts=..., only one")
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be a number from 0 (a free one) to 65535, got {port!r}")
        worker_names = _worker_names(n, names)
        _check_names(worker_names, driver_name)
        slurm = dataclasses.replace(slurm, python=slurm.python or python,
                                    gpus_per_task=slurm.gpus_per_task or (1 if gpus else None))
        return SlurmLauncher(len(worker_names), worker_names, slurm, driver_name, bind, port)
    if attach is None and hosts is None:
        if bind is not None or port:
            raise ValueError("bind and port are for workers on other machines: add attach=N or hosts=...")
        worker_names = _worker_names(n, names)
        _check_names(worker_names, driver_name)
        return LocalLauncher(worker_names, warm_start)
    if attach is not None and hosts is not None:
        raise ValueError("give attach=N (workers started elsewhere) or hosts=... (started over SSH), not both")
    if n is not None:
        raise ValueError("n is for local workers; with attach or hosts the count comes from them")
    if not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be a number from 0 (a free one) to 65535, got {port!r}")
    listed = [x.strip() for x in names.split(",") if x.strip()] if isinstance(names, str) else list(names or [])
    if hosts is not None:
        hosts = parse_hosts(hosts)
        listed = listed or [f"worker{i}" for i in range(1, len(hosts) + 1)]
        if len(listed) != len(hosts):
            raise ValueError(f"{len(hosts)} SSH workers but {len(listed)} names; give one name per worker")
        _check_names(listed, driver_name)
        return SshLauncher(hosts, listed, bind, port, ssh, python)
    if isinstance(attach, bool) or not isinstance(attach, int) or attach < 0:
        raise ValueError(f"attach must be the number of workers to wait for (>= 0), got {attach!r}")
    if listed:
        _check_names(listed, driver_name)
    return AttachLauncher(attach, listed, bind, port)


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
        check_name(name)
    everyone = [*names, driver_name]
    duplicates = sorted({x for x in everyone if everyone.count(x) > 1})
    if duplicates:
        raise ValueError(f"worker names must be unique; repeated: {', '.join(duplicates)}")
