"""The launchers' registry: ``Kind`` s by name, third-party ones by entry point, and ``choose``.

A cluster that names no launcher gets local kernels, or the one a server's
administrator names in ``NBRPC_LAUNCHER`` (a hub's ``Spawner.environment``):
``slurm`` on a hub whose servers are Slurm jobs (batchspawner), so that every
``%rpc_init -n 2`` runs its workers as a step of the student's job.

A ``Kind`` is a name, the ``Cluster`` keyword that asks for it (``attach=N``,
``hosts=...``, ``slurm=...``; none for the default), its options dataclass and a factory.
Another package adds one by an entry point in the group ``nbrpc.launchers`` that names a
``Kind``, as jupyter_client finds its provisioners. ``choose`` reads a cluster's options
and returns the launcher they ask for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib.metadata import entry_points

from ..settings import LAUNCHER_ENV, default_launcher
from .attach import AttachLauncher
from .base import Admission, Launcher, Worker
from .local import LocalLauncher
from .options import (
    AttachOptions,
    LocalOptions,
    RemoteOptions,
    Request,
    SshOptions,
    check_names,
    from_keywords,
    parse_names,
    worker_names,
)
from .slurm import SlurmLauncher, SlurmOptions
from .slurm_options import SlurmJob
from .ssh import SshLauncher

__all__ = ["Admission", "Kind", "Launcher", "Request", "Worker", "choose", "kinds"]

ENTRY_POINTS = "nbrpc.launchers"


@dataclass(frozen=True)
class Kind:
    """One way of starting workers: ``make(request, options)`` returns its launcher."""

    name: str
    key: str | None  # the Cluster keyword (and %rpc_init flag) that asks for it; None: the default
    options: type  # a dataclass that checks itself in __post_init__
    make: Callable[[Request, object], Launcher]


def _local(request: Request, options: LocalOptions) -> Launcher:
    names = worker_names(request.n, request.names)
    check_names(names, request.driver_name)
    return LocalLauncher(names, request.warm_start)


def _no_count(request: Request) -> list[str]:
    if request.n is not None:
        raise ValueError("n is for local workers; with attach or hosts the count comes from them")
    return parse_names(request.names) or []


def _attach(request: Request, options: AttachOptions) -> Launcher:
    listed = _no_count(request)
    if listed:
        check_names(listed, request.driver_name)
    return AttachLauncher(options.attach, listed, options.bind, options.port)


def _ssh(request: Request, options: SshOptions) -> Launcher:
    listed = _no_count(request) or [f"worker{i}" for i in range(1, len(options.hosts) + 1)]
    if len(listed) != len(options.hosts):
        raise ValueError(f"{len(options.hosts)} SSH workers but {len(listed)} names; give one name per worker")
    check_names(listed, request.driver_name)
    return SshLauncher(options.hosts, listed, options.bind, options.port, options.ssh, options.python)


def _slurm(request: Request, options: SlurmJob) -> Launcher:
    names = worker_names(request.n, request.names)
    check_names(names, request.driver_name)
    job = options.slurm
    job = SlurmOptions(**{**{f.name: getattr(job, f.name) for f in fields(job)},
                          "python": job.python or options.python,
                          "gpus_per_task": job.gpus_per_task or (1 if request.gpus else None)})
    return SlurmLauncher(len(names), names, job, request.driver_name, options.bind, options.port)


BUILT_IN = (Kind("local", None, LocalOptions, _local), Kind("attach", "attach", AttachOptions, _attach),
            Kind("ssh", "hosts", SshOptions, _ssh), Kind("slurm", "slurm", SlurmJob, _slurm))


def kinds() -> dict[str, Kind]:
    """Every launcher by name: the built-in ones, then those of installed packages."""
    found = {kind.name: kind for kind in BUILT_IN}
    for entry in entry_points(group=ENTRY_POINTS):
        kind = entry.load()
        if not isinstance(kind, Kind):
            raise TypeError(f"entry point {entry.name!r} of {ENTRY_POINTS!r} must name an "
                            f"nbrpc.launchers.registry.Kind, got {kind!r}")
        found.setdefault(kind.name, kind)
    return found


def keywords(registry: dict[str, Kind]) -> set[str]:
    """Every launcher option a ``Cluster`` takes as a keyword."""
    return {f.name for kind in registry.values() for f in fields(kind.options)}


def default_name() -> str:
    """The name of the launcher a cluster that names none gets (``NBRPC_LAUNCHER``, else local)."""
    return default_launcher() or "local"


def default_kind(registry: dict[str, Kind], given: dict) -> Kind:
    """The launcher of a cluster that names none: ``NBRPC_LAUNCHER``'s with its own
    defaults (``given`` gets its keyword), else local kernels."""
    name = default_name()
    kind = registry.get(name)
    if kind is None:
        raise ValueError(f"{LAUNCHER_ENV}={name!r} names no launcher; the known ones are "
                         f"{', '.join(sorted(registry))}. The server's administrator sets it "
                         "(a hub's Spawner.environment)")
    if kind.key is None:  # local kernels: no keyword asks for them
        return kind
    try:
        from_keywords(kind.options, {kind.key: True})
    except (TypeError, ValueError) as e:
        raise ValueError(f"{LAUNCHER_ENV}={name!r}: the {name} launcher cannot start workers without "
                         "options of its own; name local or slurm. The server's administrator "
                         "sets it (a hub's Spawner.environment)") from e
    given[kind.key] = True
    return kind


def choose(request: Request, **where) -> Launcher:
    """The launcher a cluster's options ask for (the options of every launcher are
    here, not in ``Cluster``), checked before anything starts."""
    registry = kinds()
    unknown = set(where) - keywords(registry)
    if unknown:
        raise TypeError(f"Cluster() got unexpected options {', '.join(map(repr, sorted(unknown)))}; "
                        "workers come from local kernels, attach=N, hosts=... (with bind, port, ssh, "
                        "python) or slurm=True")
    given = {k: v for k, v in where.items() if v is not None and v is not False}
    asked = [kind for kind in registry.values() if kind.key is not None and kind.key in given]
    if len(asked) > 1:
        keys = [f"{kind.key}=..." for kind in asked]
        raise ValueError(f"workers come from one place: give {' or '.join(keys)}, "
                         f"{'not both' if len(keys) == 2 else 'only one'}")
    kind = asked[0] if asked else default_kind(registry, given)
    own = {f.name for f in fields(kind.options)}
    foreign = sorted(k for k in given if k not in own and not (k == "port" and given[k] == 0))
    if foreign and not issubclass(kind.options, RemoteOptions) and set(foreign) <= {"bind", "port"}:
        raise ValueError("bind and port are for workers on other machines: add attach=N or hosts=...")
    if foreign:
        what = "is not an option" if len(foreign) == 1 else "are not options"
        raise ValueError(f"{', '.join(foreign)} {what} of the {kind.name} launcher")
    return kind.make(request, from_keywords(kind.options, given))
