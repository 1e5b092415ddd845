"""A shared server: another user's port scan leaves a cluster of the nbrpc kernel working.

Two real local users share a server (a network namespace of the test's own, so that
the scan reaches no other process on this machine). The student runs two clusters:
one as a plain Python driver (RPC on the server's loopback) and one as the nbrpc
kernel runs it (``deploy/kernel.py``: a user namespace of its own, RPC in a private
network). The classmate connects to and closes every listening port on the server's
loopback, the probe a curious student runs. The plain cluster breaks, as torch's
TensorPipe agent does (the reason for the private network); the private one works,
calls and a next cluster alike, and the classmate could not see or enter it.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from conftest import DRIVER_START

import nbrpc.deploy.private_network as private_network_module
from nbrpc.deploy import kernel

pytestmark = pytest.mark.netns

DRIVER = """
import importlib.util, json, os, time
if {private}:
    spec = importlib.util.spec_from_file_location("bootstrap", {module!r})
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    assert bootstrap.enter_user_namespace() is None
import torch.distributed.rpc as rpc
import nbrpc
from nbrpc.deploy.private_network import NETWORK

cluster = nbrpc.start(2, progress=None)
rpc.rpc_sync("worker1", os.getpid)  # a pipe to worker1; none yet to worker2
print(json.dumps({{"pids": [w.pid for w in cluster.workers], "inside": NETWORK.driver_inside}}), flush=True)
while not os.path.exists("scanned"):
    time.sleep(0.05)
after = {{}}
def ask(label, name):
    try:
        after[label] = rpc.rpc_sync(name, os.getuid, timeout=20)
    except Exception as e:
        after[label] = f"{{type(e).__name__}}: {{e}}"[:400]
ask("worker2", "worker2")
ask("worker1", "worker1")
cluster.shutdown()
try:
    again = nbrpc.start(2, progress=None, startup_timeout=30)
    print(json.dumps({{"pids": [w.pid for w in again.workers]}}), flush=True)
    ask("again", "worker2")
    again.shutdown()
except Exception as e:
    after["again"] = f"{{type(e).__name__}}: {{e}}"[:400]
print(json.dumps({{"after": after}}), flush=True)
"""

PROBE = """
import json, os, socket
ports = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
        for line in f.readlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # listening
                ports.add(int(local.rsplit(":", 1)[1], 16))
answered = []
for port in sorted(ports):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        answered.append(port)
    except OSError:
        pass
entered = {{}}
for pid in {pids}:
    try:
        os.close(os.open(f"/proc/{{pid}}/ns/net", os.O_RDONLY))
        entered[pid] = "opened"
    except OSError as e:
        entered[pid] = type(e).__name__
print(json.dumps({{"answered": answered, "entered": entered}}), flush=True)
"""


@pytest.fixture
def server(pids):
    """A network namespace standing for the class's server (its own loopback)."""
    if os.geteuid() != 0 or not all(_which(c) for c in ("ip", "nsenter", "setpriv")):
        pytest.skip("needs root, iproute2 and util-linux (nsenter, setpriv)")
    name = f"nbrpc-server-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        pids.end()
        subprocess.run(["ip", "netns", "delete", name], check=False)


def test_a_classmates_port_scan_leaves_the_nbrpc_kernels_cluster_working(server, student, classmate, drivers):
    student.netns = classmate.netns = server
    module = private_network_module.__file__
    plain = drivers(DRIVER.format(private=False, module=module), user=student)
    plain_started = plain.expect("pids", DRIVER_START)
    private = drivers(DRIVER.format(private=True, module=module), user=student)
    private_started = private.expect("pids", DRIVER_START)
    for started, driver in ((plain_started, plain), (private_started, private)):
        driver.pids.add(*started["pids"])
    assert (plain_started["inside"], private_started["inside"]) == (False, True)

    probe = drivers(PROBE.format(pids=private_started["pids"]), user=classmate)
    scan = probe.expect("answered", 120)
    # The scan reached the plain cluster's listeners (its driver's and workers').
    assert len(scan["answered"]) >= 3
    # It could not enter the private cluster's network.
    assert set(scan["entered"].values()) == {"PermissionError"}
    (student.home / "scanned").touch()

    broken = plain.expect("after", 180)["after"]
    kept = private.expect("after", 180)["after"]
    assert kept == {"worker2": student.uid, "worker1": student.uid, "again": student.uid}
    # What the private network is for: the plain cluster's new pipe failed, and its next start
    # names torch's agent that stopped accepting.
    assert broken["worker1"] == student.uid
    assert broken["worker2"] != student.uid
    assert "stopped accepting connections" in broken["again"]


def test_the_nbrpc_kernel_spec_runs_ipykernel_in_its_own_user_namespace():
    spec = kernel.spec()
    assert spec["argv"][1:] == [kernel.__file__, "-f", "{connection_file}"]
    assert spec["display_name"] == "Python 3 (nbrpc)"


def _which(command: str) -> bool:
    from shutil import which

    return which(command) is not None

