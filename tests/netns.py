"""Hosts on one machine for tests: network namespaces joined by a bridge.

``Network(["drv", "w1", "w2"])`` creates one namespace per host, each with its own
``eth0`` and address on a private subnet, plugged into a bridge that lives in a
namespace of its own (nothing is added to the machine's own network). ``cut``
unplugs a host (its cable: the bridge's end of its veth pair goes down).
``Process`` runs a command inside a host; ``Driver`` runs a Python driver there
that executes code sent to it, one request at a time.

Every process is recorded by pid with its start time and its descendants; the
finalizers end them, and ``Network.down`` deletes every namespace it made.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from conftest import Pids

from nbrpc._util import kill_pids

SUBNET = "10.231.7"
REPL_MARK = "@@nbrpc-test "

DRIVER_REPL = r"""
import io, json, sys, traceback
sys.path.insert(0, sys.argv[1])
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    try:
        exec(request["code"], namespace)
        reply = {"ok": True, "value": namespace.pop("result", None)}
    except BaseException as e:
        reply = {"ok": False, "type": type(e).__name__, "error": str(e),
                 "traceback": traceback.format_exc()}
    print("\n@@nbrpc-test " + json.dumps(reply, default=repr), flush=True)
"""


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespace tests need root (ip netns add); run them as root"
    if shutil.which("ip") is None:
        return "network namespace tests need iproute2 (apt-get install iproute2)"
    probe = f"nbrpc-probe-{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace here (ip netns add: {done.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Network:
    """Namespaces ``hosts`` on one bridge; ``address[host]`` is each one's address."""

    def __init__(self, hosts: list[str]):
        tag = f"nbrpc{os.getpid() % 100000}"
        self.bridge = f"{tag}-br"
        self.namespace = {h: f"{tag}-{h}" for h in hosts}
        self.address = {h: f"{SUBNET}.{i}" for i, h in enumerate(hosts, 1)}
        self.made: list[str] = []

    def up(self) -> Network:
        self._add(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for host, ns in self.namespace.items():
            self._add(ns)
            _ip("-n", self.bridge, "link", "add", f"p-{host}", "type", "veth",
                "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.bridge, "link", "set", f"p-{host}", "master", "br0")
            _ip("-n", self.bridge, "link", "set", f"p-{host}", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        return self

    def _add(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.made.append(ns)

    def cut(self, host: str) -> None:
        """Unplug ``host``: nothing reaches it or leaves it, and nobody is told."""
        _ip("-n", self.bridge, "link", "set", f"p-{host}", "down")

    def plug(self, host: str) -> None:
        _ip("-n", self.bridge, "link", "set", f"p-{host}", "up")

    def command(self, host: str, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace[host], *argv]

    def down(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made.clear()


class Process:
    """A command running inside a host; its output collects in a file."""

    def __init__(self, network: Network, host: str, argv: list[str], pids: Pids, log, stdin=None):
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(network.command(host, *argv), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=stdin or subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        pids.add(self.pid)
        self.pids = pids

    def output(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def wait_output(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in the output of pid {self.pid} "
                             f"(exit {self.proc.poll()}):\n{self.output()[-3000:]}")

    def end(self) -> None:
        self.pids.add_tree(self.pid)
        if self.proc.poll() is None:
            kill_pids([self.pid])
        self.proc.wait(timeout=10)


class Driver:
    """A Python driver inside a host, executing code it is sent, one request at a time.

    Code sets ``result`` to send a value back (JSON). Lines the driver prints that
    are not replies collect in ``lines``.
    """

    def __init__(self, network: Network, host: str, pids: Pids, folder):
        script = folder / "driver_repl.py"
        script.write_text(DRIVER_REPL)
        self.stderr_path = folder / f"driver-{host}.err"
        tests = os.path.dirname(os.path.abspath(__file__))
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                network.command(host, sys.executable, "-u", str(script), tests),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                cwd=folder, start_new_session=True,
            )
        self.pid = self.proc.pid
        pids.add(self.pid)
        self.pids = pids
        self.lines: list[str] = []
        self.replies: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(REPL_MARK):
                self.replies.put(json.loads(line[len(REPL_MARK):]))
            elif line.strip():
                self.lines.append(line.rstrip("\n"))
        self.replies.put(None)

    def send(self, code: str) -> None:
        self.proc.stdin.write(json.dumps({"code": code}) + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 120.0):
        """The next reply: its value, or AssertionError with the driver's error."""
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the driver did not answer within {timeout} s; it printed:\n"
                                 + "\n".join(self.lines[-30:]) + "\nstderr:\n" + self.stderr()) from None
        if reply is None:
            raise AssertionError(f"the driver exited ({self.proc.poll()}); stderr:\n{self.stderr()}")
        if not reply["ok"]:
            raise DriverError(reply)
        return reply["value"]

    def run(self, code: str, timeout: float = 120.0):
        self.send(code)
        return self.reply(timeout)

    def wait_line(self, pattern: str, timeout: float) -> re.Match:
        """The first line of its output (stdout or stderr) matching ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in [*self.lines, *self.stderr().splitlines()]:
                found = re.search(pattern, line)
                if found:
                    return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"the driver printed no {pattern!r}:\n" + "\n".join(self.lines[-30:])
                             + "\nstderr:\n" + self.stderr())

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]

    def end(self) -> None:
        self.pids.add_tree(self.pid)
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


class DriverError(AssertionError):
    """Code sent to a driver raised; ``type``, ``error``, ``traceback`` say what."""

    def __init__(self, reply: dict):
        self.type, self.error = reply["type"], reply["error"]
        super().__init__(f"{reply['type']}: {reply['error']}\n{reply['traceback']}")
