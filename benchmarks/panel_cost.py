"""What JupyterLab's nbrpc side panel costs a cluster at rest: CPU per member, panel open vs closed.

Starts a Jupyter server (token auth, loopback, its own runtime folder), one kernel running
``%rpc_init -n 2`` through it, and then, for ``--seconds`` each, measures every member's CPU
time (user + system, from /proc through psutil) while nothing asks (no panel: closed), while
the panel is hidden (``GET nbrpc/clusters?members=0`` every second: the drivers answer from
memory) and while it is open (``GET nbrpc/clusters`` every second, as the panel refreshes).
Prints one line per member and phase, in percent of one core. Every process it started
ends by pid.

    python benchmarks/panel_cost.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from jupyter_client import BlockingKernelClient

from nbrpc._util import unused_loopback_port


class Server:
    def __init__(self, root: Path):
        self.port, self.token, self.runtime = unused_loopback_port(), secrets.token_hex(16), root / "runtime"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime), "JUPYTER_CONFIG_DIR": str(root / "config")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", f"--IdentityProvider.token={self.token}",
             f"--ServerApp.root_dir={root}", *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("the Jupyter server did not start within 90 s")

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"},
                                         data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=30) as response:
            body = response.read()
        return json.loads(body) if body else None

    def stop(self) -> None:
        pids = [p.pid for p in psutil.Process(self.process.pid).children(recursive=True)]
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[name] = times.user + times.system
    return out


def measure(server: Server, pids: dict[str, int], seconds: float, ask: str | None) -> dict[str, float]:
    """Each member's CPU in percent of one core over ``seconds``, asking ``ask`` every second."""
    before, began = cpu_seconds(pids), time.monotonic()
    while time.monotonic() - began < seconds:
        if ask:
            server.api(ask)
        time.sleep(max(0.0, 1.0 - (time.monotonic() - began) % 1.0))
    after, took = cpu_seconds(pids), time.monotonic() - began
    return {name: 100 * (after[name] - before[name]) / took for name in pids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds per phase (default 20)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        server = Server(Path(root))
        try:
            kernel_id = server.api("/api/kernels", "POST")["id"]
            kc = BlockingKernelClient(connection_file=str(server.runtime / f"kernel-{kernel_id}.json"))
            kc.load_connection_file()
            kc.start_channels(hb=False)
            reply = kc.execute_interactive("%load_ext nbrpc\n%rpc_init -n 2", timeout=240, output_hook=lambda m: None)
            assert reply["content"]["status"] == "ok", reply["content"]
            (entry,) = server.api("/nbrpc/clusters")["clusters"]
            pids = {m["name"]: m["pid"] for m in entry["cluster"]["members"]}
            time.sleep(3)  # the cluster settles
            phases = [("closed", None), ("hidden", "/nbrpc/clusters?members=0"), ("open", "/nbrpc/clusters")]
            results = {phase: measure(server, pids, args.seconds, ask) for phase, ask in phases}
            print(f"CPU per member, % of one core, {args.seconds:g} s per phase, panel refreshing every 1 s:")
            print(f"{'member':10} " + " ".join(f"{phase:>8}" for phase, _ in phases))
            for name in pids:
                print(f"{name:10} " + " ".join(f"{results[phase][name]:8.2f}" for phase, _ in phases))
            kc.execute_interactive("%rpc_shutdown", timeout=120, output_hook=lambda m: None)
            kc.stop_channels()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
