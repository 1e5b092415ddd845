"""Each launcher's options, declared once: a dataclass that checks itself, read by
``Cluster(**where)`` and by ``%rpc_init``'s flags alike.

Parts:

- ``option``: a dataclass field that carries its help and its flag; ``flags`` lists
  them for the magic's parser, so a launcher's keyword and its flag are one declaration.
- ``parse_names``, ``worker_names``, ``check_names``, ``check_port``: the one parse of
  a list of names and the one check of names and of a port, for every launcher.
- ``LocalOptions``, ``AttachOptions``, ``SshOptions`` (``SlurmOptions`` is in
  ``slurm_options``); ``Request``: what every launcher is made from besides its options.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields

from ..settings import check_name


def option(default=None, help: str = "", *, flag: str | None = None, factory=None, **argparse):
    """A dataclass field with its ``%rpc_init`` flag (``--name-with-dashes`` unless
    ``flag``; None help: no flag) and the argparse settings of that flag."""
    metadata = {"help": help, "flag": flag, "argparse": argparse}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def flags(options_class) -> list[tuple[str, str, dict]]:
    """``(field name, flag, argparse keywords)`` of every option of ``options_class``
    that has a flag; every flag defaults to None (left out: the option's default)."""
    found = []
    for f in fields(options_class):
        if not f.metadata.get("help"):
            continue
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        found.append((f.name, flag, dict(default=None, help=f.metadata["help"], **f.metadata["argparse"])))
    return found


def from_keywords(options_class, given: dict):
    """``options_class`` from the keywords of it in ``given`` (it checks itself)."""
    names = {f.name for f in fields(options_class)}
    return options_class(**{k: v for k, v in given.items() if k in names})


def parse_names(names) -> list[str] | None:
    """``"a,b"`` or an iterable -> a list of names; None stays None."""
    if names is None:
        return None
    if isinstance(names, str):
        return [x.strip() for x in names.split(",") if x.strip()]
    return list(names)


def worker_names(n: int | None, names: Iterable[str] | None) -> list[str]:
    """The names of ``n`` local workers (``worker1`` ...), or ``names``."""
    listed = parse_names(names)
    if listed is not None:
        if n is not None and n != len(listed):
            raise ValueError(f"n={n} but {len(listed)} names given; give one or the other")
        return listed
    n = 2 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the number of workers must be a whole number >= 1, got {n!r}")
    return [f"worker{i}" for i in range(1, n + 1)]


def check_names(names: list[str], driver_name: str) -> None:
    """Raise ``ValueError`` unless ``names`` (and the driver's) are valid and unique."""
    if not names:
        raise ValueError("a cluster needs at least one worker name")
    everyone = [*names, driver_name]
    for name in everyone:
        check_name(name)
    duplicates = sorted({x for x in everyone if everyone.count(x) > 1})
    if duplicates:
        raise ValueError(f"worker names must be unique; repeated: {', '.join(duplicates)}")


def parse_hosts(hosts) -> list[str]:
    """``"hostA,hostB:2"`` -> ``["hostA", "hostB", "hostB"]`` (one entry per worker)."""
    if isinstance(hosts, str):
        hosts = [h.strip() for h in hosts.split(",") if h.strip()]
    expanded = []
    for entry in hosts:
        host, sep, count = str(entry).rpartition(":")
        if not sep or not count.isdigit():
            host, count = str(entry), "1"
        if not host or int(count) < 1:
            raise ValueError(f"bad host entry {entry!r}: use HOST or HOST:COUNT (COUNT >= 1)")
        expanded += [host] * int(count)
    if not expanded:
        raise ValueError("hosts is empty; give hostA,hostB:2")
    return expanded


def check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"port must be a number from 0 (a free one) to 65535, got {port!r}")
    return port


@dataclass(frozen=True)
class Request:
    """What every launcher is made from besides its own options."""

    n: int | None
    names: Iterable[str] | str | None
    driver_name: str
    warm_start: bool
    gpus: bool = False


@dataclass
class LocalOptions:
    """Local worker kernels (the default) take no options of their own."""


@dataclass
class RemoteOptions:
    """Where the driver listens for workers on other machines."""

    bind: str | None = option(None, "address or interface that reaches the workers (--attach, --hosts, --slurm)")
    port: int = option(0, "port the driver listens on for joining workers (default: free)", type=int)

    def __post_init__(self):
        self.port = check_port(0 if self.port is None else self.port)


@dataclass
class AttachOptions(RemoteOptions):
    """Workers started by anything else with ``nbrpc worker --join``."""

    attach: int | None = option(None, "wait for N workers started elsewhere with the printed "
                                "'nbrpc worker --join' command", type=int, metavar="N")

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.attach, bool) or not isinstance(self.attach, int) or self.attach < 0:
            raise ValueError(f"attach must be the number of workers to wait for (>= 0), got {self.attach!r}")


@dataclass
class SshOptions(RemoteOptions):
    """Worker kernels started over SSH, joining as attached ones do."""

    hosts: str | list[str] | None = option(None, "start workers over SSH: hostA,hostB:2 (two on hostB)")
    ssh: str = option("ssh", 'ssh command for --hosts (default ssh), e.g. "ssh -F my_config"')
    python: str | None = option(None)  # the interpreter on the hosts (default: this one's path)

    def __post_init__(self):
        super().__post_init__()
        self.hosts = parse_hosts(self.hosts)
        self.ssh = self.ssh or "ssh"
