"""Small helpers shared by the runtime modules."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable

import psutil

LOOPBACK = "127.0.0.1"


def listening_socket(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """Bind and listen on ``host:port`` (0 picks a free port); name the fix if taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        msg = (
            f"cannot listen on {host}:{port} ({e.strerror}); another process uses that "
            "port: choose another one or leave the port unset to pick a free one"
        )
        raise OSError(e.errno, msg) from e
    sock.listen(128)
    return sock


def unused_loopback_port() -> int:
    """A loopback port nobody listens on, below the range the OS hands to sockets bound to
    port 0: a port picked there and closed can be taken by any process's next such socket
    (a worker's RPC listener, say) before the one it was picked for binds it."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        first_ephemeral = int(f.read().split()[0])
    for port in random.sample(range(first_ephemeral // 2, first_ephemeral), 200):
        with socket.socket() as s:
            try:
                s.bind((LOOPBACK, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free port on {LOOPBACK} between {first_ephemeral // 2} and {first_ephemeral}")


def listening_ports(pid: int) -> set[int]:
    """TCP ports (IPv4) process ``pid`` listens on."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp4")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return set()
    return {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}


# The kernel's "this task is exiting" flag (PF_EXITING in /proc/PID/stat's flags),
# which psutil does not read.
_EXITING = 0x4


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is running (zombies and processes on their way out count as ended).

    A killed process closes its sockets before it turns into a zombie, so peers see
    the connection drop while its state still reads running; its flags already say
    it is exiting.
    """
    fields = _stat_fields(pid)
    if fields is None:
        return False
    try:
        return fields[0] not in ("Z", "X") and not int(fields[6]) & _EXITING
    except (IndexError, ValueError):
        return False


def pid_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger): it runs no code and answers nothing."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def start_time(pid: int) -> float | None:
    """When ``pid`` started: with the pid, it names one process."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [pid for pid in pids if pid_alive(pid)]
        for pid in alive:
            try:
                os.kill(pid, sig)
                if sig == signal.SIGTERM and pid_stopped(pid):
                    os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once resumed
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            time.sleep(0.02)
            _reap(alive)
            alive = [pid for pid in alive if pid_alive(pid)]
        if not alive:
            return


def _reap(pids: list[int]) -> None:
    """Collect exit status of our own children so they do not linger as zombies."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


# torch warnings an RPC user cannot act on. The TorchScript one is raised under
# simplefilter("always") by every functional optimizer DistributedOptimizer builds,
# so no warnings filter reaches it; it is dropped where warnings are shown.
TORCH_NOISE = (
    "`TorchScript` support for functional optimizers is deprecated",
    "as a ProcessGroup",
)


# torch's log records an RPC user cannot act on, by logger: from torch 2.15, dynamo says it
# ignores the profiler's record_function inside a compiled optimizer's step (PyTorch's
# pipeline example compiles each shard's optimizer step), once per process and member.
TORCH_LOG_NOISE = {
    "torch._dynamo.variables.ctx_manager": "Profiler record function",
    "torch._dynamo.variables.torch": "Profiler function",
}


class _DropTorchLogNoise(logging.Filter):
    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.start))


def silence_torch_noise() -> None:
    """Drop ``TORCH_NOISE`` warnings and ``TORCH_LOG_NOISE`` log records in this process
    (idempotent)."""
    import warnings

    for name, start in TORCH_LOG_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropTorchLogNoise) for f in logger.filters):
            logger.addFilter(_DropTorchLogNoise(start))

    for text in TORCH_NOISE:
        warnings.filterwarnings("ignore", message=f".*{re.escape(text)}")
    shown = warnings.showwarning
    if getattr(shown, "_nbrpc_quiet", False):
        return

    def showwarning(message, *args, **kwargs):
        if not any(text in str(message) for text in TORCH_NOISE):
            shown(message, *args, **kwargs)

    showwarning._nbrpc_quiet = True
    warnings.showwarning = showwarning


class _StderrMute:
    """This process's C-level stderr sent to /dev/null while anyone holds the mute."""

    def __init__(self):
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: int | None = None

    def hold(self) -> None:
        with self._lock:
            if self._holders == 0:
                self._saved = os.dup(2)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                os.close(null)
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                os.dup2(self._saved, 2)
                os.close(self._saved)
                self._saved = None

    def release_when_closed(self, pids: list[int], within: float) -> None:
        """Release once ``pids`` have exited all the way (zombie or gone), on a thread."""
        def wait() -> None:
            deadline = time.monotonic() + within
            while not all(map(_closed, pids)) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.05)  # TensorPipe's loop reads the end of their pipes
            self.release()

        threading.Thread(target=wait, name="nbrpc-stderr-mute", daemon=True).start()


_STDERR_MUTE = _StderrMute()
# Seconds the mute may outlast its block while children finish exiting.
MUTED_AFTER = 3.0


@contextlib.contextmanager
def muted_stderr(until_closed: Callable[[], list[int]] | None = None):
    """Send this process's C-level stderr to /dev/null for the block.

    TensorPipe logs a warning for every peer that closes its pipes; while workers
    leave at shutdown that is expected, and in a notebook it would land in the cell.
    A killed process closes its sockets only once it has given back its memory, after
    ``kill_pids`` counts it ended: with ``until_closed`` (pids, asked as the block ends),
    the mute lasts until those that are this process's children have exited all the
    way, at most ``MUTED_AFTER`` s, without holding up the caller.
    """
    _STDERR_MUTE.hold()
    try:
        yield
    finally:
        children = [p for p in (until_closed() if until_closed else []) if _child_of_mine(p)]
        if children:
            _STDERR_MUTE.release_when_closed(children, MUTED_AFTER)
        else:
            _STDERR_MUTE.release()


def _closed(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] in ("Z", "X")


def _child_of_mine(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and int(fields[1]) == os.getpid()


def process_usage(pid: int | None = None) -> dict:
    """Open descriptors, resident memory (MiB) and threads of a process (this one by default)."""
    process = psutil.Process(pid)
    with process.oneshot():
        return {"descriptors": process.num_fds(), "rss_mib": process.memory_info().rss / 2**20,
                "threads": process.num_threads()}


class JsonLines:
    """JSON objects, one per line, over a stream socket (the template's requests and replies)."""

    def __init__(self, sock: socket.socket):
        self.sock, self._buffer = sock, b""

    def send(self, message: dict) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive(self, timeout: float) -> dict | None:
        """The next message; None once the peer closed; ``TimeoutError`` if none came
        within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not readable:
                raise TimeoutError(f"no message within {timeout:g} s")
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


# Enough descriptors for clusters of thousands of workers (see raise_fd_limit).
FD_LIMIT = 65536


def raise_fd_limit(wanted: int = FD_LIMIT) -> int:
    """Raise this process's soft limit on open descriptors toward ``wanted`` (never
    above the hard limit); returns the soft limit now.

    A driver holds several descriptors per worker while a cluster runs (torch's pipes to
    each worker it calls, four sockets each, and the worker's kernel channels), so a large
    cluster would reach a soft limit of 1024, common on laptops, and then fail to accept
    connections at all.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


class Hooks:
    """Callables an upper layer registers with a lower one, which calls them: the lower
    layer keeps no slot for the upper one to fill. The newest comes first."""

    def __init__(self):
        # The hooks, newest first: changed in place, so that a layer that asks on every call
        # whether there are any may read it (a list's truth costs no Python call, ``__bool__`` one).
        self.callables: list[Callable] = []

    def add(self, hook: Callable) -> Callable:
        """Register ``hook`` (once); returns it (``discard`` takes it back)."""
        self.discard(hook)
        self.callables.insert(0, hook)
        return hook

    def discard(self, hook: Callable) -> None:
        if hook in self.callables:
            self.callables.remove(hook)

    def __bool__(self) -> bool:
        return bool(self.callables)

    def __iter__(self):
        return iter(list(self.callables))

    def first(self, *args):
        """The first answer other than None of the hooks, newest first (None: none)."""
        for hook in list(self.callables):
            found = hook(*args)
            if found is not None:
                return found
        return None
