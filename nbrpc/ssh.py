"""Start workers on other hosts over OpenSSH; they join through the rendezvous.

``ssh`` runs as the user would run it (key authentication, their ``~/.ssh/config``
honoured; ``BatchMode`` so a missing key fails at once instead of prompting). The
token travels on the command's stdin, never on a command line other users could
read with ``ps``.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile


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
