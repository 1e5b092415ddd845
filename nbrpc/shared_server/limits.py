"""Per-user limits a server's administrator (a teacher on a class's hub) sets for everyone.

Parts:

- ``Limits``: the most local workers a user may run on this machine at once (across
  all their kernels), the TensorPipe thread count a cluster gets when it asks for
  none, and the longest RPC timeout (the longest a call may wait). Each value keeps
  where it was set, so that an error names the limit and who sets it.
- ``load``: the limits in force, from the file ``/etc/nbrpc/limits.toml`` (or the one
  ``NBRPC_LIMITS`` names), then the variables a hub passes to every server it spawns
  (``c.Spawner.environment``), which win over the file.
- ``local_workers``: how many local worker kernels this user runs now.

The file (every key optional)::

    max_workers = 4      # local worker kernels per user, all their notebooks together
    threads = 4          # TensorPipe threads per member when %rpc_init gives no --threads
    max_timeout = 120    # seconds: the longest RPC timeout (--timeout) a cluster may have

These keep a class's server usable for everyone; they are not a security boundary (a
user can start processes without nbrpc): the operating system's limits are.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import tomllib

from ..errors import LimitError
from ..settings import LIMITS_ENV as KEYS
from ..settings import LIMITS_FILE_ENV as FILE_ENV
from ..settings import limits_asked

FILE = "/etc/nbrpc/limits.toml"
WORKER_COMMAND = "nbrpc.member.worker"


@dataclass(frozen=True)
class Limits:
    """The limits in force; ``None`` where none is set. ``sources`` says where each was set."""

    max_workers: int | None = None
    threads: int | None = None
    max_timeout: float | None = None
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for name in KEYS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not value > 0 or (name != "max_timeout" and value != int(value))):
                kind = "number" if name == "max_timeout" else "whole number"
                raise ValueError(f"nbrpc's limit {name} must be a positive {kind}, got {value!r} "
                                 f"({self.who(name)}); the server's administrator sets it")

    def who(self, name: str) -> str:
        """Who set ``name``, for messages."""
        return self.sources.get(name, "not set")

    def check_workers(self, asked: int, running: int) -> None:
        """Raise ``LimitError`` when ``asked`` more local workers would pass ``max_workers``."""
        if self.max_workers is None or asked + running <= self.max_workers:
            return
        room = max(0, self.max_workers - running)
        already = f", and you run {running} already (in other notebooks or kernels)" if running else ""
        then = (f"Ask for at most {room} (%rpc_init -n {room})" if room else
                "Shut a cluster down in another notebook first (%rpc_shutdown)")
        msg = (f"{asked} local worker{'s' * (asked != 1)} asked for, but this server allows at most "
               f"{self.max_workers} per user"
               f"{already} (the limit max_workers, {self.who('max_workers')}). {then}, or ask the "
               "server's administrator (your teacher on a class's hub) to raise the limit.")
        raise LimitError(msg)

    def apply(self, threads: int | None, timeout: float | None, default_threads: int,
              default_timeout: float) -> tuple:
        """A cluster's threads and RPC timeout: the ones asked for, else the server's or the
        defaults, the timeout within ``max_timeout`` (a value of the wrong kind passes through,
        for the cluster's own check to name)."""
        if threads is None:
            threads = self.threads or default_threads
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
            return threads, timeout
        return threads, self.resolve_timeout(timeout, default_timeout)

    def resolve_timeout(self, timeout: float | None, default: float) -> float:
        """The cluster's RPC timeout: the one asked for, else ``default``, within ``max_timeout``."""
        if self.max_timeout is None:
            return default if timeout is None else timeout
        if timeout is None:
            return min(default, self.max_timeout)
        if timeout > self.max_timeout:
            msg = (f"an RPC timeout of {timeout:g} s asked for, but this server allows at most "
                   f"{self.max_timeout:g} s (the limit max_timeout, {self.who('max_timeout')}). Ask for "
                   f"{self.max_timeout:g} s or less (%rpc_init --timeout {self.max_timeout:g}), or ask the "
                   "server's administrator (your teacher on a class's hub) to raise the limit.")
            raise LimitError(msg)
        return timeout


def load(environ: Mapping[str, str] | None = None) -> Limits:
    """The limits in force: the file's, then the environment's over them."""
    named, texts = limits_asked(environ)
    path = named or FILE
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except FileNotFoundError:
        if named:
            raise ValueError(f"{FILE_ENV}={path} names no file; the server's administrator sets it") from None
        table = {}
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"nbrpc's limits file {path} cannot be read ({e}); "
                         "the server's administrator sets it") from e
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"nbrpc's limits file {path} has unknown keys {', '.join(unknown)}; "
                         f"known: {', '.join(KEYS)}")
    for name, value in table.items():
        values[name], sources[name] = value, f"set in {path}"
    for name, text in texts.items():
        variable = KEYS[name]
        if text:
            try:
                values[name] = float(text) if name == "max_timeout" else int(text)
            except ValueError:
                raise ValueError(f"{variable}={text!r} is not a number; the server's administrator "
                                 "(or the hub's Spawner.environment) sets it") from None
            sources[name] = f"set by {variable} in the environment the server started with"
    return Limits(**values, sources=sources)


def local_workers(uid: int | None = None) -> int:
    """How many nbrpc worker kernels this user runs on this machine now."""
    uid = os.getuid() if uid is None else uid
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().split(b"\0")
        except OSError:
            continue
        if b"-m" in words and WORKER_COMMAND.encode() in words and b"-f" in words:
            count += 1
    return count
