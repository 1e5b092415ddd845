"""Worker kernels on other hosts, started over OpenSSH; they join as ``attach``'s do.

``ssh`` runs as the user would run it (key authentication, their ``~/.ssh/config``
honoured; ``BatchMode`` so a missing key fails at once instead of prompting). The
token travels on the command's stdin, never on a command line other users could
read with ``ps``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import tempfile
import threading

from .._util import kill_pids
from ..errors import WorkerStartError
from .attach import AttachLauncher


class SshLauncher(AttachLauncher):
    """One worker per entry of ``hosts``, named by ``names``, started with ``ssh_command``.

    The driver listens where ``hosts[0]`` reaches it unless ``bind`` says otherwise;
    ``python`` is the interpreter on the hosts (default: this one's path).
    """

    def __init__(self, hosts: list[str], names: list[str], bind: str | None = None, port: int = 0,
                 ssh_command: str = "ssh", python: str | None = None):
        toward = hostname(hosts[0], ssh_command) if not bind else None
        super().__init__(len(hosts), names, bind, port, toward)
        self.hosts, self.ssh_command = list(hosts), ssh_command
        self.python = python or sys.executable
        self._processes: dict[str, subprocess.Popen] = {}
        self._processes_lock = threading.Lock()

    def close(self) -> None:
        """Refuse new joins; end SSH processes whose worker never joined."""
        super().close()
        with self._processes_lock:
            left, self._processes = list(self._processes.values()), {}
        kill_pids([p.pid for p in left])
        for p in left:
            p.wait(timeout=5)

    def _launch(self) -> None:
        address = f"{self.address}:{self.server.port}"
        for host, name in zip(self.hosts, self.names):
            self._processes[name] = launch(host, name, address, self.token, self.ssh_command, self.python)

    def _check_launched(self) -> None:
        for name, process in list(self._processes.items()):
            if process.poll() is not None:
                raise WorkerStartError(self._failure(
                    f"the ssh command for {name!r} on {process.nbrpc_host} exited with code "
                    f"{process.returncode} before its worker joined. Its output:\n{output(process)}"))

    def _not_joined(self) -> list[str]:
        left = dict(self._processes)
        if not left:
            return []
        return ["Not joined: " + ", ".join(f"{n} on {p.nbrpc_host}" for n, p in left.items()) + "."]

    def _reserved(self) -> set[str]:
        return set(self._processes)

    def _claim(self, name: str) -> subprocess.Popen | None:
        with self._processes_lock:
            return self._processes.pop(name, None)


def hostname(host: str, ssh_command: str = "ssh") -> str:
    """The address ``ssh`` would connect to for ``host`` (its config's HostName)."""
    done = subprocess.run([*shlex.split(ssh_command), "-G", host], capture_output=True,
                          text=True, timeout=30)
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname":
            return value
    return host


def launch(host: str, name: str, address: str, token: str, ssh_command: str,
           python: str) -> subprocess.Popen:
    """Start ``nbrpc worker --join`` on ``host`` as worker ``name``."""
    remote = " ".join(shlex.quote(x) for x in (
        python, "-m", "nbrpc.cli", "worker", "--join", address, "--name", name, "--token", "-"))
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(
        [*shlex.split(ssh_command), "-T", "-o", "BatchMode=yes", host, remote],
        stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        process.stdin.write(token.encode() + b"\n")
        process.stdin.close()
    except OSError:
        pass  # ssh already ended; its output says why
    process.nbrpc_host, process.nbrpc_log = host, log
    return process


def output(process: subprocess.Popen, limit: int = 4000) -> str:
    """What the ssh command (and the worker behind it) printed, the last part."""
    process.nbrpc_log.seek(0)
    text = process.nbrpc_log.read().decode(errors="replace")
    return text[-limit:].strip() or "(no output)"
