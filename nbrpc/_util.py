"""Small helpers shared by the runtime modules."""

from __future__ import annotations

import os
import signal
import socket
import time

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


def pid_alive(pid: int) -> bool:
    """True while ``pid`` is running (zombies count as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = [pid for pid in pids if pid_alive(pid)]
        for pid in alive:
            try:
                os.kill(pid, sig)
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
