"""A worker's settings: what a worker kernel needs to join its driver's group.

Parts:

- ``WorkerSettings``: one frozen record (name, rank, the group's store and key
  prefix, threads, timeout, transport, devices, tracking, call recording, the signing key, ...).
  A local worker gets it in its environment (``to_env``, read back by
  ``from_env`` in the worker bootstrap); a worker that joins from elsewhere gets
  it in its grant over the rendezvous (``to_wire`` / ``from_wire``: the same
  variables less the ones about the driver's machine, which it sets for itself).
- ``check_name``: the one check of a worker's name, as torch RPC requires it.

- The readers of the variables people set (``join_token``, ``warm_start_wanted``,
  ``default_launcher``, ``limits_asked``, ``clock_skew``, ``shared_tensors_wanted``,
  ``shared_tensors_min_bytes``, ``frozen_after``, ``in_a_worker``).

Every ``NBRPC_*`` variable is named here, and only this module reads one from an
environment (a layout test checks): ``TOKEN_ENV`` and ``WARM_START_ENV`` are the ones a
person sets; an administrator sets the launcher and the limits; the rest carry a worker's
settings.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .group import DEFAULT_TRANSPORT
from .group.devices import Placement

# Set by people: the join token (``nbrpc worker``), and ``0`` to turn the warm template off.
TOKEN_ENV = "NBRPC_TOKEN"
# Large tensors land in huge pages: a 100 MB RPC round trip gets several times faster
# (fewer page faults on fresh receive buffers). torch reads this once, at start.
FAST_ALLOC_ENV = {"THP_MEM_ALLOC_ENABLE": "1"}
WARM_START_ENV = "NBRPC_WARM_START"
# Set by a server's administrator (a hub's ``Spawner.environment``): the limits file, and
# each limit, over the file's (see ``limits``).
LIMITS_FILE_ENV = "NBRPC_LIMITS"
# Set by the nbrpc kernel when it could not have a private network (the reason); the
# kernel keeps its own copy of the name (``kernel``: it runs before this package loads).
NO_PRIVATE_NETWORK_ENV = "NBRPC_NO_PRIVATE_NETWORK"
# Set by a server's administrator: the launcher a cluster uses when it names none
# (``slurm`` on a hub whose servers are Slurm jobs: workers as steps of that job).
LAUNCHER_ENV = "NBRPC_LAUNCHER"
LIMITS_ENV = {"max_workers": "NBRPC_MAX_WORKERS", "threads": "NBRPC_DEFAULT_THREADS",
              "max_timeout": "NBRPC_MAX_TIMEOUT"}  # each limit, over the limits file's (by an administrator)
# Set by a test in a worker's environment: seconds added to that worker's clock, which
# then reads as another machine's (see ``recording.clocks``).
CLOCK_SKEW_ENV = "NBRPC_CLOCK_SKEW"
# Room the template process keeps in its environment for a worker's (see ``template``).
TEMPLATE_ROOM_ENV = "NBRPC_TEMPLATE_ROOM"
# Set by people in the kernel's environment (seconds): how long a member may leave the
# hang watch's probes unanswered before a running cell calls it frozen. On a loaded
# machine (a shared server, notebooks run at the idle priority) a member may only be slow.
FROZEN_AFTER_ENV = "NBRPC_FROZEN_AFTER"

WORKER_NAME_ENV = _NAME = "NBRPC_NAME"  # set in every worker (its name)
_RANK = "NBRPC_RANK"
_PREFIX = "NBRPC_PREFIX"
_KEY = "NBRPC_KEY"
_THREADS = "NBRPC_THREADS"
_TIMEOUT = "NBRPC_TIMEOUT"
_TRACK = "NBRPC_TRACK"
_TRACE = "NBRPC_TRACE"
_TRANSPORT = "NBRPC_TRANSPORT"
_DEVICES = "NBRPC_DEVICES"
# About the driver's machine: a worker that joins from elsewhere sets its own.
_STORE = "NBRPC_STORE"
_DRIVER_PID = "NBRPC_DRIVER_PID"
_INTERFACE = "NBRPC_INTERFACE"
_IMPORT_PATH = "NBRPC_IMPORT_PATH"
# Set by people (0: off) in the driver's environment; the driver sets it for its local
# workers (1: on). Big tensors between local members through shared memory.
SHARED_TENSORS_ENV = "NBRPC_SHARED_TENSORS"
# Set by people in the driver's environment (bytes): the smallest storage that goes through
# shared memory, e.g. 1 to force every tensor that way (a test run of the whole path);
# the driver passes it on to its local workers.
SHARED_TENSORS_MIN_BYTES_ENV = "NBRPC_SHARED_TENSORS_MIN_BYTES"
_LOCAL_ONLY = (_STORE, _DRIVER_PID, _INTERFACE, _IMPORT_PATH, SHARED_TENSORS_ENV, SHARED_TENSORS_MIN_BYTES_ENV)

_VALID_NAME = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")


def check_name(name) -> None:
    """Raise ``ValueError`` unless ``name`` is a name torch RPC accepts for a worker."""
    if not isinstance(name, str) or not _VALID_NAME.match(name):
        raise ValueError(
            f"invalid worker name {name!r}: use letters, digits, '_', ':' or '-' "
            "(1 to 127 characters), as torch RPC requires"
        )


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker reads at start."""

    name: str
    rank: int
    prefix: str  # the group's key prefix in the store
    key: bytes  # signs every RPC pickle of the group (see ``serialization``)
    threads: int  # TensorPipe worker threads
    timeout: float  # default RPC timeout, s
    track: bool = True  # RRef tracking (see ``rref_ledger``)
    trace: bool = False  # every RPC recorded (see ``tracing``)
    transport: str = DEFAULT_TRANSPORT  # TensorPipe's transport (see ``membership.TRANSPORTS``)
    placement: Placement | None = None  # devices and maps; None on CPU
    store: str = ""  # HOST:PORT of the group's store, as this worker reaches it
    driver_pid: int | None = None  # a local worker exits when this process does
    interface: str | None = None  # where its TensorPipe listener goes (None: torch's choice)
    env: Mapping[str, str] = field(default_factory=dict)  # more variables for its process
    # A local worker imports what the driver can (as mp.spawn's children do): a driver
    # script's sibling modules, a notebook's folder.
    import_path: tuple[str, ...] = ()
    shared_tensors: bool = False  # big tensors through shared memory (``wire.shared_tensors``)
    shared_tensors_min_bytes: int | None = None  # the smallest storage sent that way (None: its default)

    def to_env(self) -> dict[str, str]:
        """The environment variables a worker process starts with."""
        env = {**self.env, _PREFIX: self.prefix, _NAME: self.name, _RANK: str(self.rank),
               _THREADS: str(self.threads), _TIMEOUT: str(self.timeout),
               _TRACK: "1" if self.track else "0", _TRACE: "1" if self.trace else "0",
               _KEY: self.key.hex(), _TRANSPORT: self.transport, _INTERFACE: self.interface or ""}
        devices = self.placement.to_json() if self.placement else None
        for variable, value in ((_DEVICES, devices), (_STORE, self.store or None),
                                (_DRIVER_PID, self.driver_pid),
                                (_IMPORT_PATH, os.pathsep.join(self.import_path) or None),
                                (SHARED_TENSORS_ENV, "1" if self.shared_tensors else "0"),
                                (SHARED_TENSORS_MIN_BYTES_ENV, self.shared_tensors_min_bytes)):
            if value is not None:
                env[variable] = str(value)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerSettings:
        """The settings ``to_env`` wrote (``env`` is this process's environment)."""
        return cls(
            name=env[_NAME], rank=int(env[_RANK]), prefix=env[_PREFIX], key=bytes.fromhex(env[_KEY]),
            threads=int(env[_THREADS]), timeout=float(env[_TIMEOUT]), track=env.get(_TRACK, "1") == "1",
            trace=env.get(_TRACE, "0") == "1",
            transport=env.get(_TRANSPORT, DEFAULT_TRANSPORT), placement=Placement.from_json(env.get(_DEVICES)),
            store=env.get(_STORE, ""),
            driver_pid=int(env[_DRIVER_PID]) if env.get(_DRIVER_PID) else None,
            interface=env.get(_INTERFACE) or None,
            import_path=tuple(p for p in env.get(_IMPORT_PATH, "").split(os.pathsep) if p),
            shared_tensors=env.get(SHARED_TENSORS_ENV) == "1",
            shared_tensors_min_bytes=shared_tensors_min_bytes(env),
        )

    def to_wire(self) -> dict[str, str]:
        """The settings in a grant to a worker that joins from elsewhere (JSON)."""
        return {k: v for k, v in self.to_env().items() if k not in _LOCAL_ONLY}

    @classmethod
    def from_wire(cls, granted: Mapping[str, str], store: str, interface: str | None) -> WorkerSettings:
        """The granted settings, with what the worker found out about its own machine."""
        if not isinstance(granted, Mapping) or not all(isinstance(v, str) for v in granted.values()):
            raise ValueError(f"the driver's grant holds no settings: {json.dumps(granted)[:200]}")
        mine = {k: v for k, v in granted.items() if k not in _LOCAL_ONLY}
        env = {k: v for k, v in mine.items() if not k.startswith("NBRPC_")}
        return replace(cls.from_env(mine), store=store, interface=interface, env=env)

    def for_this_machine(self, store: str, driver_pid: int, interface: str) -> WorkerSettings:
        """These settings for a worker on the driver's own machine."""
        import_path = tuple(os.path.abspath(p) for p in sys.path if os.path.isdir(p or "."))
        return replace(self, store=store, driver_pid=driver_pid, interface=interface, import_path=import_path)


# -- the variables people set, read from this process's environment --------------------


def switched_on(variable: str) -> bool:
    """Whether environment variable ``variable`` leaves a feature on: on unless it is set to
    0, false, no or off."""
    return os.environ.get(variable, "1").strip().lower() not in ("0", "false", "no", "off")


def shared_tensors_wanted() -> bool:
    """Whether this driver's environment leaves the shared memory path on (its default)."""
    return switched_on(SHARED_TENSORS_ENV)


def warm_start_wanted() -> bool:
    """Whether this environment leaves the warm template on (its default)."""
    return switched_on(WARM_START_ENV)


def join_token() -> str:
    """The join token ``nbrpc worker`` takes when given no ``--token`` ("" if none)."""
    return os.environ.get(TOKEN_ENV, "")


def default_launcher() -> str:
    """The launcher an administrator named for clusters that name none ("" if none)."""
    return os.environ.get(LAUNCHER_ENV, "").strip()


def in_a_worker() -> bool:
    """Whether this process is a worker kernel (its name is in its environment)."""
    return _NAME in os.environ


def clock_skew() -> float:
    """Seconds a test adds to this worker's clock (0 unless set)."""
    text = os.environ.get(CLOCK_SKEW_ENV, "").strip()
    try:
        return float(text or 0)
    except ValueError:
        raise ValueError(f"{CLOCK_SKEW_ENV}={text!r} is not a number of seconds; unset it or "
                         "set it to one") from None


def frozen_after(default: float) -> float:
    """Seconds a member may stay silent before a cell calls it frozen (``default`` unless
    set); ``ValueError`` naming the variable unless it is a positive number of seconds."""
    text = os.environ.get(FROZEN_AFTER_ENV, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{FROZEN_AFTER_ENV}={text!r} is not a positive number of seconds: set it to how "
                         "long a member may leave the hang watch's probes unanswered before a running cell "
                         f"calls it frozen (e.g. 30 on a loaded machine), or unset it for the default ({default:g} s)")
    return seconds


def limits_asked(environ: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """What an administrator set in ``environ`` (default: this process's) about the limits:
    the limits file named ("" for the default) and each limit's text, by its name."""
    environ = os.environ if environ is None else environ
    texts = {name: environ.get(variable, "").strip() for name, variable in LIMITS_ENV.items()}
    return environ.get(LIMITS_FILE_ENV, ""), {name: text for name, text in texts.items() if text}


def shared_tensors_min_bytes(env: Mapping[str, str] = os.environ) -> int | None:
    """The smallest storage ``env`` sends through shared memory (None: the default);
    ``ValueError`` naming the variable unless it is a positive number of bytes."""
    value = env.get(SHARED_TENSORS_MIN_BYTES_ENV, "").strip()
    if not value:
        return None
    try:
        nbytes = int(value)
    except ValueError:
        nbytes = 0
    if nbytes < 1:
        raise ValueError(f"{SHARED_TENSORS_MIN_BYTES_ENV}={value!r} is not a positive number of bytes: set it "
                         "to the smallest storage to send through shared memory (1 sends every tensor that "
                         "way), or unset it for the default (1 MiB)")
    return nbytes
