"""A warm template for local workers: fork a ready Python instead of starting a fresh one.

A fresh worker spends about 2 s of CPU importing torch and ipykernel. The template is
a process that has imported them (and nbrpc's worker code) once, has started no thread
(no OpenMP pool, no ZMQ context, no RPC agent), and forks a worker per request. Each
worker then makes its own kernel, keys, ports and RPC agent, as a fresh one does.

This module is the driver's side (``launch``); ``template_process`` is the template's.
The first local cluster starts the template
(``python -m nbrpc.member.template_process FD``) with one end of a socket pair; requests and
replies are JSON lines on it, nothing on the filesystem or the network. The template
lives as long as the driver: it exits when the socket closes or the driver is gone,
and the driver ends it by pid at exit. The template sits in its own session, and so
do the workers it forks, so a Ctrl-C in the driver's terminal reaches neither.

Each worker is forked twice (template, then a short-lived middle process that exits
at once) and lands as a child of the driver, which is a child subreaper: the driver
reaps it and reads its exit status as it does for a launched worker, and the
worker's own watch on its parent works unchanged. The middle process's exit is what
hands the worker over; the worker waits for it before it does anything else.

Set ``NBRPC_WARM_START=0`` (or ``Cluster(warm_start=False)``) to launch every worker
as a fresh process. Workers whose environment differs from the template's in a
variable read while Python and its libraries start (``PYTHONPATH``, ``OMP_*``, ...)
are launched fresh too.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import socket
import subprocess
import sys
import threading
import time

from .._compat import jupyter_compat
from .._util import JsonLines, kill_pids
from ..errors import WorkerStartError
from ..settings import FAST_ALLOC_ENV, TEMPLATE_ROOM_ENV, WARM_START_ENV, in_a_worker, warm_start_wanted
from ..shared_server import private_network

READY_TIMEOUT = 60.0
REPLY_TIMEOUT = 30.0
WATCH_INTERVAL = 0.5
# Read by Python or a library while the process starts, before any request could set them.
START_ENV_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_",
                      "THP_", "TORCH_", "MALLOC_", "CUDA_", "VIRTUAL_ENV")
_PR_SET_CHILD_SUBREAPER = 36
# Room in the template's argument and environment areas for a worker's command line
# and environment, so /proc/PID/cmdline and /proc/PID/environ show the worker's own.
_ARGV_ROOM = 400
_ENV_ROOM = 16384

_lock = threading.Lock()
_template: Template | None = None


def enabled(warm_start: bool | None = None) -> bool:
    """Whether local workers start from the template (the option, else the environment)."""
    if warm_start is not None:
        return bool(warm_start)
    return warm_start_wanted()


def start_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(START_ENV_PREFIXES)}


class Forked:
    """A forked worker as the driver sees it: its own child, reaped by pid (like Popen)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        # One reaper at a time: a thread that found the pid reaped by another (ChildProcessError)
        # would otherwise read 0 while that one holds the real status (a kill read as "exited").
        self._reaping = threading.Lock()

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: Popen reads that as 0 too
                    self.returncode = 0
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode


class Template:
    """The driver's handle on its template process."""

    def __init__(self, env: dict[str, str], inside: bool = False):
        """``inside``: in this process's private network (``private_network``), as its local workers are."""
        _become_subreaper()
        self.inside = inside
        mine, theirs = socket.socketpair()
        self.env = env
        # numpy's OpenBLAS starts its thread pool as it loads; the workers get theirs back.
        spawn_env = {**env, "OPENBLAS_NUM_THREADS": env.get("OPENBLAS_NUM_THREADS", "1"),
                     TEMPLATE_ROOM_ENV: "." * _ENV_ROOM}
        self.env_room = _environ_size(spawn_env)
        def spawn() -> subprocess.Popen:
            jupyter_compat.stop_debugging_new_processes()  # the notebook's debugger must not start it
            return subprocess.Popen(
                [sys.executable, "-m", "nbrpc.member.template_process", str(theirs.fileno()), " " * _ARGV_ROOM],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=spawn_env, cwd=os.getcwd(), start_new_session=True,
            )

        # A process inherits the network namespace of the thread that starts it.
        self.proc = private_network.NETWORK.run(spawn) if inside else spawn()
        theirs.close()
        self.sock, self.lines = mine, JsonLines(mine)
        self.ready: dict | None = None
        self.started, self.ready_after = time.monotonic(), None  # seconds it took to be ready
        atexit.register(self.close)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None and self.sock.fileno() >= 0

    def wait_ready(self, timeout: float) -> bool:
        if self.ready is None:
            self.ready = self._receive(timeout)
            self.ready_after = time.monotonic() - self.started
        return self.ready is not None

    def fork(self, request: dict) -> int | str | None:
        """The forked worker's pid, the reason it could not start, or None if the template is gone."""
        try:
            self.lines.send(request)
        except OSError:
            return None
        reply = self._receive(REPLY_TIMEOUT)
        if reply is None:
            return None
        if "reap" in reply:
            try:
                Forked(reply["reap"]).wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        return reply["pid"] if "pid" in reply else str(reply.get("error", reply))

    def _receive(self, timeout: float) -> dict | None:
        """The template's next message; None if it is gone or silent for ``timeout`` s."""
        try:
            return self.lines.receive(timeout)
        except (TimeoutError, OSError, ValueError):
            return None

    def close(self) -> None:
        """End the template by pid (its forked workers are not its children any more)."""
        atexit.unregister(self.close)
        self.sock.close()
        kill_pids([self.proc.pid], grace=1.0)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def prestart() -> None:
    """Start the template now, if there is none, without waiting for it."""
    with _lock:
        try:
            _running()
        except OSError:  # workers will be launched fresh
            pass


def prestart_in_kernel() -> None:
    """``prestart`` when this process is a running Jupyter kernel that is not a worker:
    a notebook that imports nbrpc starts a cluster next. A script, the nbrpc kernel
    before it runs, a worker and the template itself start nothing here."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None or in_a_worker() or not enabled():
        return
    try:
        prestart()
    except Exception:  # never break ``import nbrpc``: the first cluster starts one, or says why
        pass


def current() -> Template | None:
    return _template


def launch(name: str, argv: list[str], env: dict[str, str], workdir: str, log_path: str) -> Forked | None:
    """Fork worker ``name`` from the template, or None when it should be launched fresh.

    ``env`` is the worker's whole environment. Raises ``WorkerStartError`` when the
    template could not fork it (the cause is in the message).
    """
    with _lock:
        try:
            template = _running()
        except OSError:
            return None
        if start_env(env) != start_env(template.env) or _environ_size(env) > template.env_room:
            return None
        if not template.wait_ready(READY_TIMEOUT):  # it could not start: launch fresh
            _discard()
            return None
        answer = template.fork({"argv": argv, "env": env, "cwd": workdir, "log": log_path,
                                "driver": os.getpid()})
        if answer is None:  # the template died: the next worker gets a new one
            _discard()
            return None
    if isinstance(answer, str):
        raise WorkerStartError(
            f"worker {name!r} could not be forked from the warm template: {answer}. "
            f"Fix the cause, or start workers as fresh processes ({WARM_START_ENV}=0 "
            "or warm_start=False)."
        )
    return Forked(answer)


def _running() -> Template:
    """The template, started anew if it died or if this process's own start-up
    variables changed since it started (a library imported later set ``KMP_*``, say),
    so later workers fork from one that matches them."""
    global _template
    env = {**os.environ, **FAST_ALLOC_ENV}
    inside = private_network.NETWORK.for_local_workers()
    if _template is None or not _template.alive() or start_env(_template.env) != start_env(env) \
            or _template.inside != inside:
        _discard()
        _template = Template(env, inside)
    return _template


def _discard() -> None:
    global _template
    if _template is not None:
        _template.close()
        _template = None


def _environ_size(env: dict[str, str]) -> int:
    return sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in env.items())


def _become_subreaper() -> None:
    """Orphans below this process become its children (forked workers land here)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


# -- the template process ----------------------------------------------------------
