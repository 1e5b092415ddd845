"""A shared machine: what another local user can reach of a running cluster, and what not.

TensorPipe and the rendezvous store listen on loopback, which every local user can
connect to; what they carry is guarded instead: every RPC pickle is signed with the
cluster's key and a member refuses one that is not, before unpickling anything.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import textwrap

import pytest
import torch.distributed.rpc as rpc

from nbrpc._util import listening_ports
from nbrpc.group import membership
from nbrpc.wire import serialization

GUEST = "nbrpc-guest"


@pytest.mark.parametrize("key", [None, b"x" * 32], ids=["unsigned", "wrong key"])
def test_a_member_refuses_rpc_pickles_without_the_clusters_key(cluster, key):
    serialization.set_key(key)  # this process sends as an outsider would
    try:
        with pytest.raises(Exception, match="refused an RPC message not signed with this cluster's key"):
            rpc.rpc_sync("worker1", os.getpid, timeout=10)
    finally:
        serialization.set_key(membership.GROUP.driver.key)
    worker_pid = next(w.pid for w in cluster.workers if w.name == "worker1")
    assert rpc.rpc_sync("worker1", os.getpid) == worker_pid  # and it stays healthy


@pytest.fixture(scope="module")
def guest():
    """A second local user (made for the test where we are root)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to make a second local user")
    try:
        pwd.getpwnam(GUEST)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        GUEST], check=True)
    entry = pwd.getpwnam(GUEST)
    return entry.pw_uid, entry.pw_gid


PROBE = textwrap.dedent("""
    import json, os, socket, sys
    pid, ports, paths, sockets = int(sys.argv[1]), *map(json.loads, sys.argv[2:])
    found = {}
    try:
        open(f"/proc/{pid}/environ", "rb").read()
        found["environ"] = "read"
    except OSError as e:
        found["environ"] = type(e).__name__
    for path in paths:
        try:
            open(path, "rb").read()
            found[path] = "read"
        except OSError as e:
            found[path] = type(e).__name__
    for path in sockets:
        try:
            socket.socket(socket.AF_UNIX).connect(path)
            found[path] = "connected"
        except OSError as e:
            found[path] = type(e).__name__
    for port in ports:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            found[str(port)] = "connected"
        except OSError as e:
            found[str(port)] = type(e).__name__
    print(json.dumps(found))
""")


def test_what_a_second_local_user_can_reach(cluster, guest, pids):
    import json

    worker = cluster.workers[0]
    # The worker's TCP listeners are TensorPipe's (its kernel is on Unix sockets). One
    # stray connection makes torch's agent stop accepting on all of them (a torch
    # limitation, see docs/limitations.md), so the probe touches a worker's, never the driver's.
    ports = sorted(listening_ports(worker.pid))[:1]
    assert ports
    paths = [worker.connection_file]
    scratch = os.path.dirname(worker.connection_file)
    sockets = [os.path.join(scratch, f) for f in os.listdir(scratch) if f.startswith("kernel-")]
    assert len(sockets) == 5, "the kernel's five channels are Unix sockets"
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("needs a system python3 the second user can run (this one is in our home)")
    probe = subprocess.Popen(
        [python, "-c", PROBE, str(worker.pid), *map(json.dumps, (ports, paths, sockets))],
        user=guest[0], group=guest[1], extra_groups=[], stdout=subprocess.PIPE, text=True,
        cwd="/", env={"PATH": os.environ.get("PATH", "")})
    pids.add(probe.pid)
    found = json.loads(probe.communicate(timeout=60)[0])
    # what carries the secrets is out of reach: the worker's environment (the key), its
    # kernel's connection file (the kernel's message key) and the kernel's sockets
    assert found["environ"] == "PermissionError"
    assert found[worker.connection_file] == "PermissionError"
    assert {found[path] for path in sockets} == {"PermissionError"}
    # TensorPipe's port is: its pickles must be signed (the test above)
    assert {found[str(p)] for p in ports} == {"connected"}
