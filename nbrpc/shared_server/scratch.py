"""Scratch folders: the private temporary folders nbrpc makes, and sweeping the stale ones.

A local worker's folder holds its kernel's connection file, its log and its Unix
sockets; ``nbrpc run`` and a joined worker make one too. Whoever ends a worker
removes its folder (the driver at shutdown, a worker's watchdog when the driver
died). When every process that could remove it was killed at once (SIGKILL, the
out-of-memory killer, a machine reboot leaves ``/tmp`` alone), nobody does; on a
shared server those pile up over a semester. So:

- ``make``: a folder only this user can enter, named ``nbrpc-LABEL-XXXXXXXX``, with an
  ``owners`` record: each process that uses it, by pid and start time.
- ``add_owner``: a process that uses the folder too (a worker, once it runs).
- ``sweep``: remove this user's folders whose owners have all ended. ``make`` sweeps
  once per process, so the next cluster on the server tidies what a killed one left;
  ``nbrpc sweep`` does it on demand (a hub's pre-spawn hook, a cron job).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time

from .._util import pid_alive, start_time

PREFIX = "nbrpc-"
OWNERS = "owners"
# A folder made by an nbrpc that kept no owners record is a local worker's when it has
# this log; it is stale once no process names it and it is this old.
LEGACY_LOG = "output.log"
LEGACY_AGE = 600.0
# A Unix socket's path fits in 107 bytes (sockaddr_un); a kernel names its sockets
# "kernel-N" inside its folder, N a port number of up to 5 digits.
SOCKET_PATH_MAX = 107
SOCKET_NAME_MAX = len("kernel-65535")
# Where a folder for sockets goes when the temporary folder is too deep for them.
SHORT_BASE = "/tmp"


class _Sweeper:
    """Sweeps the temporary folder once per process (a fork sweeps again)."""

    def __init__(self):
        self.swept_in: int | None = None

    def once(self) -> None:
        if self.swept_in != os.getpid():
            self.swept_in = os.getpid()
            sweep()


SWEEPER = _Sweeper()


def make(label: str, owners: tuple[int, ...] = (), sockets: bool = False) -> str:
    """A new folder only this user can enter, owned by this process and ``owners``.

    With ``sockets`` the folder is one a kernel's Unix sockets fit in: in ``/tmp`` when
    the temporary folder (``TMPDIR``) is too deep for their paths.
    """
    SWEEPER.once()
    prefix = f"{PREFIX}{label[:24]}-"
    base = tempfile.gettempdir()
    # mkdtemp adds 8 characters to the prefix.
    if sockets and len(os.path.join(base, prefix + "x" * 8, "")) + SOCKET_NAME_MAX > SOCKET_PATH_MAX:
        base = SHORT_BASE
    folder = tempfile.mkdtemp(prefix=prefix, dir=base)  # mode 0700
    # Written whole, then renamed: a sweep never sees a record without this process.
    record = os.path.join(folder, OWNERS + ".new")
    with os.fdopen(os.open(record, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write("".join(_line(pid) for pid in (os.getpid(), *owners)))
    os.rename(record, os.path.join(folder, OWNERS))
    return folder


def add_owner(folder: str, pid: int) -> None:
    """Record ``pid`` as a user of ``folder`` too (after the process that made it)."""
    fd = os.open(os.path.join(folder, OWNERS), os.O_WRONLY | os.O_APPEND)
    with os.fdopen(fd, "a") as f:
        f.write(_line(pid))


def _line(pid: int) -> str:
    """``pid`` and its start time, so that a reused pid is not taken for it."""
    began = start_time(pid)
    return "" if began is None else f"{pid} {began!r}\n"


def owners_alive(folder: str) -> bool | None:
    """Whether a recorded owner of ``folder`` still runs; None when it has no record."""
    try:
        with open(os.path.join(folder, OWNERS)) as f:
            lines = f.read().split("\n")
    except FileNotFoundError:
        return None
    for line in lines:
        pid, _, began = line.partition(" ")
        try:
            pid_number, began_at = int(pid), float(began)
        except ValueError:
            continue  # the end, or a line a killed process left half written
        if pid_alive(pid_number) and start_time(pid_number) == began_at:
            return True
    return False


def sweep(base: str | None = None) -> list[str]:
    """Remove this user's stale nbrpc folders in ``base``; return them.

    Without ``base``: in the temporary folder and in ``/tmp``, where ``make`` puts
    folders for sockets when the temporary folder is too deep.
    """
    if base is None:
        return [f for b in dict.fromkeys([tempfile.gettempdir(), SHORT_BASE]) for f in sweep(b)]
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return []
    named: set[str] | None = None
    removed = []
    for name in names:
        folder = os.path.join(base, name)
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue  # another user's, or not a folder nbrpc made
        alive = owners_alive(folder)
        if alive is None:
            if named is None:
                named = _folders_named_by_processes(base)
            alive = not _legacy_stale(folder, info, named)
        if not alive:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _legacy_stale(folder: str, info: os.stat_result, named: set[str]) -> bool:
    return (os.path.exists(os.path.join(folder, LEGACY_LOG))
            and time.time() - info.st_mtime > LEGACY_AGE and folder not in named)


def _folders_named_by_processes(base: str) -> set[str]:
    """The nbrpc folders that this user's live processes name on their command lines."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        for word in words:
            if word.startswith(os.path.join(base, PREFIX)):
                found.add(os.path.join(base, os.path.relpath(word, base).split(os.sep)[0]))
    return found
