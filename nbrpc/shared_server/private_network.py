"""A private network for a local cluster, out of every other user's reach.

On a shared server every local user can connect to every listening port on loopback,
and one connection that closes before its handshake makes torch's TensorPipe agent
stop accepting (a port scan breaks a student's cluster). Here a local cluster's RPC
lives in a network namespace of its own: the driver's TensorPipe listener and
rendezvous store, and its local workers, on a loopback only they share. Nothing else
moves: the kernel's own sockets (Jupyter's messages, the user's downloads) stay on
the machine's network, since a network namespace is a property of each thread.

Parts:

- ``enter_user_namespace``: at the very start of a kernel (``nbrpc.shared_server.kernel``, the
  nbrpc kernel spec), while it runs one thread, make a user namespace that maps the
  user to itself. The process keeps its uid, files and groups; it gains the right to
  make network namespaces, which an unprivileged process lacks, and no right over
  anything outside its own namespaces.
- ``PrivateNetwork`` (``NETWORK``): the namespace, made on first use by a thread that
  unshares it and brings its loopback up; ``run(fn)`` calls ``fn`` in a thread inside
  it, so every thread ``fn`` starts (TensorPipe's, the store's) and every process it
  launches (the warm template, a worker) is inside too. ``available()`` says whether
  this process can; where it cannot (a plain ``python3`` kernel, a server that forbids
  user namespaces), clusters run on the machine's loopback as before.

Workers on other machines (SSH, Slurm, attach) need the driver on the machine's
network: a process whose first cluster was local keeps its RPC in the private one
(torch's agent listens where it first did), as ``group.driver_group`` already says.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CAP_SYS_ADMIN = 21
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

T = TypeVar("T")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def enter_user_namespace() -> str | None:
    """Move this (one-threaded) process into a new user namespace that maps its user and
    group to themselves; return why it could not, or None."""
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(CLONE_NEWUSER) != 0:
        return f"unshare(CLONE_NEWUSER): {os.strerror(ctypes.get_errno())}"
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")
    except OSError as e:
        return f"mapping the user into its namespace: {e}"
    return None


def in_own_user_namespace() -> bool:
    """Whether this process is in a user namespace of its own, with the right to make
    network namespaces in it."""
    try:
        with open("/proc/self/uid_map") as f:
            mapped = f.read().split()
        with open("/proc/self/status") as f:
            caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    whole = mapped[:3] == ["0", "0", "4294967295"]
    return not whole and bool(int(caps, 16) >> CAP_SYS_ADMIN & 1)


class PrivateNetwork:
    """This process's private network namespace, made on first use."""

    def __init__(self):
        self._fd: int | None = None
        self._lock = threading.Lock()
        # Where the driver joined RPC (once per process): inside (True), outside (False), not yet (None).
        self.driver_inside: bool | None = None

    def available(self) -> bool:
        return self._fd is not None or in_own_user_namespace()

    def for_local_workers(self) -> bool:
        """Whether local workers (and the warm template) start inside: where the driver is,
        or will be for a first local cluster."""
        return self.driver_inside is not False and self.available()

    def join_as_driver(self, join: Callable[[], T], first: bool, local: bool) -> T:
        """``join()`` (the driver's join): inside for a first local cluster where this process
        can be; a later cluster goes where the first went, and workers from elsewhere cannot
        reach a private one."""
        if first:
            inside = local and self.available()
            driver = self.run(lambda: _without_name_lookup_noise(join)) if inside else join()
            self.driver_inside = inside
            return driver
        if self.driver_inside and not local:
            from ..errors import ClusterRunningError  # here: the kernel loads this file alone, by path

            raise ClusterRunningError(
                "this kernel's RPC lives in its private network (its first cluster was local, out of "
                "other users' reach), where workers from elsewhere (attach, SSH, Slurm) cannot reach "
                "it: restart the kernel and start this cluster first")
        return join()

    def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a thread inside the namespace (made now if need be); its result or error."""
        outcome: dict = {}

        def inside():
            try:
                self._enter()
                outcome["value"] = fn()
            except BaseException as e:  # handed to the caller's thread
                outcome["error"] = e

        thread = threading.Thread(target=inside, name="nbrpc-private-network", daemon=True)
        thread.start()
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _enter(self) -> None:
        libc = _libc()
        with self._lock:
            if self._fd is None:
                if libc.unshare(CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) for the cluster's private "
                                                      f"network: {os.strerror(ctypes.get_errno())}")
                _loopback_up()
                self._fd = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
                return
        if libc.setns(self._fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into the cluster's private network: "
                                              f"{os.strerror(ctypes.get_errno())}")


def _without_name_lookup_noise(join: Callable[[], T]) -> T:
    """Join with C-level stderr muted: in a network namespace with no route out, torch's
    store client logs that it cannot look its own address's name up (DNS is out of reach),
    a warning with nothing to act on that would land in the cell. Failures still raise."""
    from .._util import muted_stderr  # here: the kernel loads this file alone, by path

    with muted_stderr():
        return join()


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)  # a struct ifreq: the name, then the flags
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


NETWORK = PrivateNetwork()
