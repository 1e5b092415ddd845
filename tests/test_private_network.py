"""A shared server: another user's port scan leaves a cluster of the nbrpc kernel working.

Two real local users share a server (a network namespace of the test's own, so that
the scan reaches no other process on this machine). The student runs two clusters:
one as a plain Python driver (RPC on the server's loopback) and one as the nbrpc
kernel runs it (``shared_server/kernel.py``: a user namespace of its own, RPC in a private
network). The classmate connects to and closes every listening port on the server's
loopback, the probe a curious student runs. The plain cluster breaks, as torch's
TensorPipe agent does (the reason for the private network); the private one works,
calls and a next cluster alike, and the classmate could not see or enter it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from conftest import DRIVER_START, execute, streamed

import nbrpc.shared_server.private_network as private_network_module
from nbrpc.shared_server import kernel

DRIVER = """
import importlib.util, json, os, time
if {private}:
    spec = importlib.util.spec_from_file_location("bootstrap", {module!r})
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    assert bootstrap.enter_user_namespace() is None
import torch.distributed.rpc as rpc
import nbrpc
from nbrpc.shared_server.private_network import NETWORK

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


@pytest.mark.slow
@pytest.mark.netns
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


@pytest.fixture
def nbrpc_kernel(tmp_path, pids):
    """Factory: a real kernel of the nbrpc kernel spec (installed under ``tmp_path``) and its client."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    folder = kernel.install(prefix=str(tmp_path / "prefix"))
    specs = KernelSpecManager(kernel_dirs=[os.path.dirname(folder)])
    started = []

    def start():
        km = KernelManager(kernel_name=kernel.NAME, kernel_spec_manager=specs)
        km.start_kernel(cwd=str(tmp_path))
        pids.add(km.provisioner.pid)
        kc = km.client()
        kc.start_channels()
        started.append((km, kc))
        kc.wait_for_ready(timeout=120)
        return kc

    yield start
    for km, kc in started:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _run(kc, code: str) -> str:
    messages, reply = execute(kc, code, timeout=180)
    assert reply["status"] == "ok", f"{reply.get('ename')}: {reply.get('evalue')}"
    return streamed(messages)


def _error(kc, code: str) -> str:
    _, reply = execute(kc, code, timeout=180)
    assert reply["status"] == "error"
    return f"{reply['ename']}: {reply['evalue']}"


NAMESPACES = """
import json, os, nbrpc
print(json.dumps({"kernel": os.readlink("/proc/self/ns/net"),
                  "workers": [os.readlink(f"/proc/{w.pid}/ns/net") for w in nbrpc.current().workers],
                  "uid_map": open("/proc/self/uid_map").read().split()}))
"""


def test_the_kernel_names_its_variable_as_the_settings_do():
    from nbrpc import settings

    assert kernel.NO_PRIVATE_NETWORK_ENV == settings.NO_PRIVATE_NETWORK_ENV


def test_nbrpc_kernelspec_installs_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "nbrpc.cli", "kernelspec", "--prefix", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    installed = tmp_path / "share" / "jupyter" / "kernels" / "nbrpc" / "kernel.json"
    assert done.stdout.strip() == f"nbrpc: installed the kernel spec 'nbrpc' in {installed.parent}"
    spec = json.loads(installed.read_text())
    assert spec["argv"] == [sys.executable, kernel.__file__, "-f", "{connection_file}"]
    assert spec["display_name"] == "Python 3 (nbrpc)"


@pytest.mark.slow
def test_the_nbrpc_kernel_keeps_its_own_network_and_gives_its_cluster_a_private_one(nbrpc_kernel):
    kc = nbrpc_kernel()
    _run(kc, "%load_ext nbrpc")
    said = _run(kc, "%rpc_init -n 2")
    assert "master + worker1, worker2 up in" in said and "c10d" not in said  # no lookup noise
    seen = json.loads(_run(kc, NAMESPACES))
    host = os.readlink("/proc/self/ns/net")
    assert seen["kernel"] == host  # Jupyter's messages, the user's downloads
    assert len(set(seen["workers"])) == 1 and seen["workers"][0] != host
    assert seen["uid_map"] == [str(os.getuid()), str(os.getuid()), "1"]  # the user, as itself
    assert _run(kc, "import torch.distributed.rpc as rpc\nprint(rpc.rpc_sync('worker2', pow, args=(3, 4)))") \
        .strip() == "81"
    _run(kc, "%rpc_shutdown")
    _run(kc, "%rpc_init -n 1")
    assert _run(kc, "print(rpc.rpc_sync('worker1', pow, args=(2, 5)))").strip() == "32"
    _run(kc, "%rpc_shutdown")
    # Workers from elsewhere cannot reach the private network: said before anything starts.
    said = _error(kc, "nbrpc.start(attach=0, bind='127.0.0.1', progress=None)")
    assert said.startswith("ClusterRunningError: this kernel's RPC lives in its private network")


# A server that starts an nbrpc kernel and ends as it starts (culled, or stopped): once the
# kernel has a second thread (its first step's watch; ipykernel starts its own watch after its
# other threads), under a subreaper (a container's init, a CI runner). The orphaned kernel
# comes to the reaper, not to init, which ipykernel's watch takes for its parent.
ORPHANING_SERVER = """
import os, sys, time
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
km = KernelManager(kernel_name="nbrpc", kernel_spec_manager=KernelSpecManager(kernel_dirs=[sys.argv[1]]))
log = open(sys.argv[2], "w")
km.start_kernel(stdout=log, stderr=log)
pid = km.provisioner.pid
began = time.monotonic()
while len(os.listdir(f"/proc/{pid}/task")) < 2 and time.monotonic() - began < 60:
    time.sleep(0.005)
print(pid, flush=True)
os._exit(0)
"""
REAPER = """
import ctypes, json, os, subprocess, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
server = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], stdout=subprocess.PIPE, text=True)
kernel = int(server.stdout.readline())
server.wait()
began = time.monotonic()
while time.monotonic() - began < 30:
    if os.waitpid(kernel, os.WNOHANG)[0] == kernel:
        print(json.dumps({"kernel": kernel, "ended_after": time.monotonic() - began}))
        sys.exit()
    time.sleep(0.05)
os.kill(kernel, 9)
os.waitpid(kernel, 0)
print(json.dumps({"kernel": kernel, "ended_after": None}))
"""


def test_an_nbrpc_kernel_ends_with_a_server_that_ended_as_it_started(tmp_path, pids):
    folder = kernel.install(prefix=str(tmp_path / "prefix"))
    said = tmp_path / "kernel.log"
    reaper = subprocess.Popen([sys.executable, "-c", REAPER, ORPHANING_SERVER, os.path.dirname(folder), str(said)],
                              stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")})
    pids.add(reaper.pid)
    out, _ = reaper.communicate(timeout=120)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["ended_after"] is not None, f"the kernel outlived its server by 30 s:\n{said.read_text()}"
    assert "nbrpc kernel: the process that launched it" in said.read_text()
    print(f"\nthe orphaned kernel ended {seen['ended_after']:.2f} s after its server")


ATTACH = """
import nbrpc
cluster = nbrpc.Cluster(attach=0, bind="127.0.0.1", progress=None).start()
print(cluster.join_command)
"""


@pytest.mark.slow
def test_an_nbrpc_kernel_whose_first_workers_attach_keeps_them_on_the_machines_network(nbrpc_kernel, pids):
    kc = nbrpc_kernel()
    command = _run(kc, ATTACH).strip().splitlines()[-1].split()
    assert command[:3] == ["nbrpc", "worker", "--join"]
    worker = subprocess.Popen([sys.executable, "-m", "nbrpc.cli", *command[1:], "--name", "outside"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids.add(worker.pid)
    _run(kc, "import time\nwhile not cluster.workers or cluster.workers[0].state != 'running': time.sleep(0.1)")
    assert _run(kc, "import torch.distributed.rpc as rpc\nprint(rpc.rpc_sync('outside', pow, args=(2, 3)))") \
        .strip() == "8"
    _run(kc, "cluster.shutdown()")
    assert worker.wait(timeout=30) == 0
    # A local cluster after it shares the machine's network with the driver.
    _run(kc, "%load_ext nbrpc")
    _run(kc, "%rpc_init -n 1")
    seen = json.loads(_run(kc, NAMESPACES))
    assert seen["workers"] == [seen["kernel"]]
    assert _run(kc, "print(rpc.rpc_sync('worker1', pow, args=(2, 5)))").strip() == "32"
    _run(kc, "%rpc_shutdown")


def _which(command: str) -> bool:
    from shutil import which

    return which(command) is not None

