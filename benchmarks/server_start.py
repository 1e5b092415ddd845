"""What the side panel's server extension costs every Jupyter server: start-up and memory.

Starts a Jupyter server (loopback, token auth, its own runtime folder) with nbrpc's server
extension (``nbrpc_server``) enabled and with it disabled, in turns, and times each from
the start of the process to its first answer of ``/api/status``; then reads its resident
memory. The extension imports no torch, so the two should be about equal.

    python benchmarks/server_start.py [--runs 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil
from results import row, write_rows

from nbrpc._util import unused_loopback_port


def start_once(enabled: bool) -> tuple[float, float]:
    """(seconds to the first answer, resident MiB) of one server."""
    with tempfile.TemporaryDirectory() as root:
        port, token = unused_loopback_port(), secrets.token_hex(16)
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": f"{root}/runtime", "JUPYTER_CONFIG_DIR": f"{root}/config"}
        began = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             f"--ServerApp.jpserver_extensions=nbrpc_server={enabled}",
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            took = _wait_up(port, token, began)
            return took, psutil.Process(process.pid).memory_info().rss / 2**20
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def _wait_up(port: int, token: str, began: float) -> float:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status",
                                     headers={"Authorization": f"token {token}"})
    while time.perf_counter() - began < 120:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                response.read()
            return time.perf_counter() - began
        except OSError:
            time.sleep(0.02)
    raise RuntimeError("the Jupyter server did not answer within 120 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    found = {True: [], False: []}
    for _ in range(args.runs):  # in turns, so that the machine's drift falls on both
        for enabled in (True, False):
            found[enabled].append(start_once(enabled))
    start = {k: statistics.median(s for s, _ in v) for k, v in found.items()}
    rss = {k: statistics.median(m for _, m in v) for k, v in found.items()}
    print(f"Jupyter server start, median of {args.runs} runs: with nbrpc's extension {start[True]:.2f} s, "
          f"{rss[True]:.0f} MiB; without {start[False]:.2f} s, {rss[False]:.0f} MiB")
    write_rows([row("server_start", start[True], start[False],
                    note=f"medians of {args.runs} runs; resident memory {rss[True]:.0f} MiB with, "
                         f"{rss[False]:.0f} MiB without")], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
