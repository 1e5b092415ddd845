"""The warm template's own side: import what a worker needs once, then fork a worker
per request from the driver (see ``template`` for the driver's side and the design).

Each request is forked twice (here, then a short-lived middle process that exits at
once, handing the worker to the driver, a child subreaper); the worker rewrites its
command line and environment areas to its own, takes fresh random streams and its
BLAS pool back, and runs as ``python -m nbrpc.member.worker ARGV`` would.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import os
import signal
import socket
import sys
import time

from .._util import JsonLines, pid_alive
from ..launchers.template import WATCH_INTERVAL

# What a kernel's ``initialize`` imports on top of ipykernel's modules (its debugger,
# history, completer, inspector, event loop): 155 modules, 70 ms of CPU on a quiet
# machine and 2-4 times that while a cluster starts, once here instead of in every worker.
KERNEL_IMPORTS = ("ipykernel.debugger", "IPython.core.completerlib", "IPython.core.oinspect",
                  "IPython.extensions.storemagic", "sqlite3", "tornado.gen", "tornado.queues",
                  "tornado.platform.asyncio", "encodings.idna")


def serve(fd: int) -> None:
    """Import everything a worker needs, say ready, then fork a worker per request."""
    import random  # noqa: F401

    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import jupyter_client  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed.rpc  # noqa: F401

    import nbrpc.member.worker  # noqa: F401

    for name in KERNEL_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # another ipykernel or IPython: its kernels import what they use
            pass
    sock = socket.socket(fileno=fd)
    lines = JsonLines(sock)
    driver = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the driver ends it, by pid
    lines.send({"ready": os.getpid(), "threads": _threads()})
    while True:
        if os.getppid() != driver or not pid_alive(driver):
            os._exit(0)
        try:
            request = lines.receive(WATCH_INTERVAL)
        except TimeoutError:
            continue
        if request is None:
            os._exit(0)
        lines.send(_fork(request, sock))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _fork(request: dict, sock: socket.socket) -> dict:
    if _threads() != 1:
        return {"error": f"the template runs {_threads()} threads and cannot fork safely"}
    sys.stdout.flush()
    sys.stderr.flush()
    status_r, status_w = os.pipe()
    try:
        middle = os.fork()
    except OSError as e:
        os.close(status_r)
        os.close(status_w)
        return {"error": f"fork failed: {e}"}
    if middle == 0:  # the middle process: fork the worker and exit, handing it to the driver
        try:
            os.close(status_r)
            sock.close()
            me = os.getpid()  # read before the fork: the worker may outlive it at once
            if os.fork() == 0:
                _become_worker(request, status_w, me)
            os._exit(0)
        except BaseException as e:
            _say(status_w, f"error fork failed: {e}")
            os._exit(1)
    os.close(status_w)
    status = b""
    while True:
        chunk = os.read(status_r, 4096)
        if not chunk:
            break
        status += chunk
    os.close(status_r)
    os.waitpid(middle, 0)
    word, _, rest = status.decode(errors="replace").partition(" ")
    if word == "ok":
        return {"pid": int(rest)}
    if word == "failed":  # the driver reaps it: it is the driver's child by now
        pid, _, why = rest.partition(" ")
        return {"error": why, "reap": int(pid)}
    return {"error": rest or "the forked worker ended before it could start"}


def _say(fd: int, text: str) -> None:
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def _become_worker(request: dict, status_w: int, middle: int) -> None:
    """In the forked worker: become what ``python -m nbrpc.member.worker ARGV`` would be, then run it."""
    try:
        deadline = time.monotonic() + 10
        while os.getppid() == middle and time.monotonic() < deadline:
            time.sleep(0.0005)
        if os.getppid() != request["driver"]:
            raise RuntimeError("the driver ended before the worker started")
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        template_dir = os.getcwd()
        os.chdir(request["cwd"])
        if sys.path and sys.path[0] == template_dir:  # python -m puts its start folder first
            sys.path[0] = request["cwd"]
        os.environ.clear()
        os.environ.update(request["env"])
        import nbrpc.member.worker

        sys.argv = [nbrpc.member.worker.__file__, *request["argv"]]
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
    except BaseException as e:
        _say(status_w, f"failed {os.getpid()} {type(e).__name__}: {e}")
        os._exit(1)
    # The template forks the next worker while this one finishes here; what fails
    # from now on is in the worker's output, as for a launched worker.
    _say(status_w, f"ok {os.getpid()}")
    os.close(status_w)
    code = 0
    try:
        _reseed()
        if "OPENBLAS_NUM_THREADS" not in request["env"]:
            _restore_blas_threads()
        # libc's environment now lives in copies: the original area is free to rewrite.
        _rewrite_area(47, b"".join(os.fsencode(k) + b"=" + os.fsencode(v) + b"\0"
                                   for k, v in os.environ.items()))
        _rewrite_area(45, b"\0".join(os.fsencode(a) for a in
                                      [sys.executable, "-m", "nbrpc.member.worker", *request["argv"]]))
        nbrpc.member.worker.main(request["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _reseed() -> None:
    """Fresh random streams: every fork would otherwise draw the template's numbers."""
    import random

    import torch

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def _restore_blas_threads() -> None:
    """The BLAS pool a fresh process would have had (one thread per usable core)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(len(os.sched_getaffinity(0)), user_api="blas")


def _rewrite_area(field: int, text: bytes) -> None:
    """Write ``text`` over this process's argument (45) or environment (47) area.

    ``field`` indexes /proc/self/stat after the command name: the area's start,
    then its end. What does not fit is cut; the rest is zeroed.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[field]), int(fields[field + 1])
    except (OSError, IndexError, ValueError):
        return
    text = text[: end - start - 1]
    ctypes.memmove(start, text + b"\0" * (end - start - len(text)), end - start)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
