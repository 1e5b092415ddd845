"""Workers on other hosts, with real hosts on one machine: network namespaces.

Each namespace is a host with its own address on a bridge (see ``netns``). The
driver is a Python process in ``drv``; workers join it from ``w1`` and ``w2`` with
``nbrpc worker --join``, or are started there over OpenSSH. The tests check RPC,
RRefs and ``%%rpc_on`` across hosts, refusals (token, name), what listens where,
a forged kernel message, a cut network link, a killed driver, and ``nbrpc.waits()``
and ``nbrpc.stacks()`` of an SSH worker whose RPC threads are all blocked, or that is frozen.

They need root and iproute2 (and openssh-server for the SSH test); elsewhere they
skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import netns
import pytest
from conftest import wait_gone
from netns import Driver, DriverError, Network, Process

from nbrpc.launchers.rendezvous import LOST_AFTER, ORPHANED_AFTER

REASON = netns.unavailable()
pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

NBRPC = [sys.executable, "-m", "nbrpc.cli"]
DRIVER_DEATH_EXIT = 10.0
RPC_TIMEOUT = 30.0
SHUTDOWN_LIMIT = 30.0
START = 180.0

SETUP = """
import json, os, socket, time
import torch
import torch.distributed.rpc as rpc
import nbrpc
"""


@pytest.fixture(scope="module")
def network():
    net = Network(["drv", "w1", "w2"])
    try:
        yield net.up()
    finally:
        net.down()


@pytest.fixture
def hosts(network, pids, tmp_path):
    """Factories for processes inside the hosts; every one is ended at the end."""
    started: list = []

    class Hosts:
        net = network

        def driver(self, host: str = "drv") -> Driver:
            started.append(Driver(network, host, pids, tmp_path))
            return started[-1]

        def worker(self, host: str, *args: str, env: dict | None = None) -> Process:
            log = tmp_path / f"{host}-{len(started)}.log"
            argv = ["env", *[f"{k}={v}" for k, v in (env or {}).items()], *NBRPC, "worker", *args]
            started.append(Process(network, host, argv, pids, log))
            return started[-1]

        def process(self, host: str, argv: list[str], name: str) -> Process:
            started.append(Process(network, host, argv, pids, tmp_path / f"{name}.log"))
            return started[-1]

    yield Hosts()
    for process in reversed(started):
        process.end()
    # Shown by pytest only when the test failed: what each worker said (a worker that
    # never joined explains itself here).
    for process in started:
        if isinstance(process, Process):
            print(f"--- {process.log_path.name} (pid {process.pid}, exit {process.proc.returncode})\n"
                  f"{process.output()[-4000:]}")


def _join_address(driver: Driver) -> tuple[str, str]:
    found = driver.wait_line(r"nbrpc worker --join (\S+) --token (\S+)", START)
    return found.group(1), found.group(2)


def _start_attached(hosts, driver: Driver, workers: dict[str, str | None], **options) -> dict:
    """Start an attach cluster in ``driver``; ``workers``: host -> --name (or None)."""
    args = ", ".join(f"{k}={v!r}" for k, v in options.items())
    driver.send(SETUP + f"cluster = nbrpc.Cluster(attach={len(workers)}, bind="
                f"{hosts.net.address['drv']!r}, timeout={RPC_TIMEOUT}, startup_timeout={START}, "
                f"progress=None{', ' if args else ''}{args})\ncluster.start()")
    address, token = _join_address(driver)
    started = {}
    for host, name in workers.items():
        started[host] = hosts.worker(host, "--join", address, "--token", token,
                                     *(["--name", name] if name else []))
    driver.reply(START)
    return started


def _listeners(pid: int) -> list[tuple[str, int]]:
    from test_imports import proc_listeners

    return proc_listeners([pid])[pid]


# -- attach: join, refuse, RPC, RRefs, %%rpc_on, late joins, listeners ------------


def test_attach_across_hosts(hosts, tmp_path):
    net = hosts.net
    drv, w1, w2 = (net.address[h] for h in ("drv", "w1", "w2"))
    driver = hosts.driver()
    driver.run(SETUP + "from IPython.core.interactiveshell import InteractiveShell\n"
               "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'nbrpc')")
    driver.send(f"ip.run_line_magic('rpc_init', '--attach 2 --bind {drv} --port 29517 "
                f"--timeout {RPC_TIMEOUT:g} --startup-timeout {START:g}')")
    address, token = _join_address(driver)
    assert address == f"{drv}:29517"

    # Refused before torch sees them, with a message on both sides.
    wrong = hosts.worker("w2", "--join", address, "--token", "not-the-token")
    missing = hosts.worker("w2", "--join", address)
    for refused, reason in ((wrong, "wrong token"), (missing, "no token given")):
        assert refused.proc.wait(timeout=START) == 2
        assert f"the driver at {address} refused this worker: {reason}" in refused.output()
        driver.wait_line(f"refused a worker from {w2} .*: {reason}", 30)

    workers = {"w1": hosts.worker("w1", "--join", address, "--token", token, "--name", "trainer"),
               "w2": hosts.worker("w2", "--join", address, env={"NBRPC_TOKEN": token})}
    driver.reply(START)

    rows = driver.run("c = nbrpc.current()\nresult = [(w.name, w.rank, w.ip, w.pid, w.state) for w in c.workers]")
    by_name = {name: [rank, ip, pid, state] for name, rank, ip, pid, state in rows}
    assert set(by_name) == {"trainer", "worker1"}
    assert by_name["trainer"][1:3] == [w1, workers["w1"].pid]
    assert by_name["worker1"][1:3] == [w2, workers["w2"].pid]
    assert {state for *_, state in by_name.values()} == {"running"}
    ranks = sorted(rank for rank, *_ in by_name.values())
    assert len(set(ranks)) == 2 and ranks[0] >= 1
    members = driver.run("result = nbrpc.group.membership.member_names()")
    assert sorted(members) == ["master", "trainer", "worker1"]

    # RPC both ways of hosts, an RRef and its snapshot.
    answers = driver.run(
        "def where():\n    import os, socket\n    return os.getpid(), socket.gethostname()\n"
        "result = [rpc.rpc_sync(n, where)[0] for n in ('trainer', 'worker1')]\n"
        "x = rpc.rpc_sync('trainer', torch.add, args=(torch.arange(3.0), 1))\n"
        "result.append(x.tolist())\n"
        "result.append(rpc.rpc_sync('worker1', rpc.rpc_sync, args=('trainer', os.getpid)))\n"
        "rref = rpc.remote('worker1', torch.ones, args=((2, 3),))\n"
        "result.append(rref.to_here().sum().item())")
    assert answers == [workers["w1"].pid, workers["w2"].pid, [1.0, 2.0, 3.0], workers["w1"].pid, 6.0]
    snapshot = driver.run("result = nbrpc.rref_snapshot()")
    assert {(w["name"], w["pid"]) for w in snapshot["workers"]} >= {
        ("trainer", workers["w1"].pid), ("worker1", workers["w2"].pid)}
    assert [r["owner"] for r in snapshot["rrefs"]] == ["worker1"]
    assert snapshot["rrefs"][0]["summary"].startswith("Tensor[2, 3]")

    # %%rpc_on runs on the remote kernels and streams back, tagged.
    driver.run("ip.run_cell_magic('rpc_on', 'all', 'import os\\nprint(\"pid\", os.getpid())')")
    driver.wait_line(rf"\[trainer\] pid {workers['w1'].pid}$", 10)
    driver.wait_line(rf"\[worker1\] pid {workers['w2'].pid}$", 10)
    with pytest.raises(DriverError) as failed:
        driver.run("ip.run_cell_magic('rpc_on', 'trainer', '1 / 0')")
    assert failed.value.type == "RemoteError" and "trainer: ZeroDivisionError" in failed.value.error

    # A name already in the cluster is refused; a later joiner gets a fresh rank.
    taken = hosts.worker("w1", "--join", address, "--token", token, "--name", "trainer")
    assert taken.proc.wait(timeout=START) == 2
    assert "the name 'trainer' is taken in this cluster" in taken.output()
    late = hosts.worker("w1", "--join", address, "--token", token, "--name", "late")
    late_rank = driver.run(
        "deadline = time.monotonic() + 120\n"
        "while not [w for w in c.workers if w.name == 'late' and w.state == 'running']:\n"
        "    assert time.monotonic() < deadline, 'late never joined'\n    time.sleep(0.1)\n"
        "result = [c.worker('late').rank, rpc.rpc_sync('late', os.getpid)]", timeout=START)
    assert late_rank == [ranks[-1] + 1, late.pid]
    driver.run("ip.run_cell_magic('rpc_on', 'late', 'print(\"late here\")')")
    driver.wait_line(r"\[late\] late here$", 10)

    _check_listeners(driver, {workers["w1"].pid: w1, workers["w2"].pid: w2, late.pid: w1}, drv)
    _check_forged_message(driver, tmp_path)

    began = time.monotonic()
    driver.run("ip.run_line_magic('rpc_shutdown', '')")
    assert time.monotonic() - began < SHUTDOWN_LIMIT
    for process in (*workers.values(), late):
        assert process.proc.wait(timeout=10) == 0
        assert "the driver ended the cluster; exiting" in process.output()
    assert driver.run("result = nbrpc.group.membership.member_names()") == ["master"]

    # A local cluster still works in the same driver afterwards.
    local = driver.run("local = nbrpc.start(1, progress=None)\n"
                       "result = [rpc.rpc_sync('worker1', os.getpid), local.workers[0].pid]\n"
                       "local.shutdown()")
    assert local[0] == local[1]


def _check_listeners(driver: Driver, workers: dict[int, str], driver_address: str) -> None:
    """Every listener is on the host's own address or loopback; none on every interface."""
    for pid, address in {**workers, driver.pid: driver_address}.items():
        found = _listeners(pid)
        assert {a for a, _ in found} <= {address, "127.0.0.1"}, (pid, found)
        if pid != driver.pid:  # five kernel ports and TensorPipe's, on the worker's address
            assert len([a for a, _ in found if a == address]) >= 6, (pid, found)
    found = _listeners(driver.pid)
    assert (driver_address, 29517) in found  # the rendezvous
    assert any(a == "127.0.0.1" for a, _ in found)  # the store, reached only through it


def _check_forged_message(driver: Driver, folder) -> None:
    """A kernel message signed with the wrong key is dropped unanswered and never runs."""
    marker = folder / "forged-ran"
    forged = f"open({str(marker)!r}, 'w').close()"
    answered = driver.run(
        "import json, queue\nfrom jupyter_client import BlockingKernelClient\n"
        "info = json.load(open(c.worker('trainer').connection_file))\n"
        "info['key'] = 'f' * 64\n"
        "kc = BlockingKernelClient()\nkc.load_connection_info(info)\nkc.start_channels()\n"
        f"kc.execute({forged!r})\n"
        "try:\n    kc.get_shell_msg(timeout=5)\n    result = True\n"
        "except queue.Empty:\n    result = False\nkc.stop_channels()")
    assert answered is False
    assert not marker.exists()
    # The cluster's own, correctly signed client still works.
    driver.run("ip.run_cell_magic('rpc_on', 'trainer', 'print(\"still fine\")')")
    driver.wait_line(r"\[trainer\] still fine$", 10)


# -- failures across the network ----------------------------------------------------


def test_timeline_clocks_across_hosts(hosts):
    """Recorded calls between hosts, on one clock: worker "a" runs 3.5 s ahead
    (NBRPC_CLOCK_SKEW), so its offset is measured over the network; after the
    correction every callee's run lies within its caller's send-to-reply interval."""
    driver = hosts.driver()
    driver.send(SETUP + f"cluster = nbrpc.Cluster(attach=2, bind={hosts.net.address['drv']!r}, "
                f"timeout={RPC_TIMEOUT}, startup_timeout={START}, progress=None, trace=True)\n"
                "cluster.start()")
    address, token = _join_address(driver)
    workers = [hosts.worker("w1", "--join", address, "--token", token, "--name", "a",
                            env={"NBRPC_CLOCK_SKEW": "3.5"}),
               hosts.worker("w2", "--join", address, "--token", token, "--name", "b")]
    driver.reply(START)
    snap = driver.run(
        "def add(x):\n    return x + 1\n"
        "def relay(x):\n    return rpc.rpc_sync('b', add, args=(x,))\n"
        "with nbrpc.trace() as t:\n"
        "    for _ in range(3):\n        rpc.rpc_sync('a', relay, args=(torch.ones(250),))\n"
        "        rpc.rpc_sync('b', add, args=(torch.ones(250),))\n"
        "result = t.snapshot()")
    clocks = {c["worker"]: c for c in snap["clocks"]}
    assert clocks["a"]["offset"] == pytest.approx(-3.5, abs=clocks["a"]["bound"] + 0.002)
    assert 0 < clocks["a"]["bound"] < 0.05
    # b's machine is the driver's in all but network: one boot, one CLOCK_MONOTONIC
    assert (clocks["b"]["offset"], clocks["b"]["bound"]) == (0.0, 0.0)
    shape = [(c["caller"], c["callee"], c["name"]) for c in snap["calls"]]
    assert shape == [("master", "a", "relay"), ("a", "b", "add"), ("master", "b", "add")] * 3
    for c in snap["calls"]:
        slack = clocks[c["caller"]]["bound"] + clocks[c["callee"]]["bound"]
        assert c["sent"] - slack <= c["began"] <= c["ended"] <= c["replied"] + slack, c
        assert c["request"]["tensor"] == 1000 and c["reply"]["tensor"] == 1000
    inner = [c for c in snap["calls"] if c["caller"] == "a"]
    outer = {c["id"]: c for c in snap["calls"] if c["name"] == "relay"}
    for c in inner:  # nested, and within its parent's run once corrected
        parent = outer[c["parent"]]
        slack = clocks["a"]["bound"]
        assert parent["began"] - slack <= c["sent"] and c["replied"] <= parent["ended"] + slack
    assert driver.run("cluster.shutdown()\nresult = nbrpc.group.membership.member_names()") == ["master"]
    for process in workers:
        assert process.proc.wait(timeout=10) == 0


def test_link_cut(hosts):
    net = hosts.net
    driver = hosts.driver()
    workers = _start_attached(hosts, driver, {"w1": None, "w2": None})
    names = driver.run("result = {w.name: w.pid for w in cluster.workers}")
    cut_name = next(n for n, p in names.items() if p == workers["w1"].pid)
    other = next(n for n in names if n != cut_name)

    driver.send(f"began = time.monotonic()\ntry:\n    rpc.rpc_sync({cut_name!r}, time.sleep, args=(60,))\n"
                "    result = None\nexcept Exception as e:\n"
                "    result = [type(e).__name__, str(e), time.monotonic() - began]")
    time.sleep(2.0)
    net.cut("w1")
    cut = time.monotonic()
    try:
        kind, message, _ = driver.reply(RPC_TIMEOUT + 10)
        reported = time.monotonic() - cut
        assert kind == "WorkerDiedError", message
        assert f"worker {cut_name!r}" in message and net.address["w1"] in message
        assert "unreachable" in message
        assert reported < RPC_TIMEOUT
        assert LOST_AFTER - 2 < reported < LOST_AFTER + 5
        print(f"link cut reported after {reported:.1f} s")

        # The rest keeps working; the lost worker fails fast, by name.
        alive = driver.run(
            f"result = [rpc.rpc_sync({other!r}, os.getpid)]\n"
            f"cluster.run('print(\"still here\")', {other!r})\n"
            f"began = time.monotonic()\ntry:\n    rpc.rpc_sync({cut_name!r}, os.getpid)\n"
            "except nbrpc.WorkerDiedError as e:\n    result += [str(e), time.monotonic() - began]\n"
            f"try:\n    cluster.run('1', {cut_name!r})\nexcept nbrpc.WorkerDiedError as e:\n"
            "    result.append(str(e))\n"
            "result.append({r['name']: r['state'] for r in cluster.status()})")
        assert alive[0] == workers["w2"].pid
        assert cut_name in alive[1] and alive[2] < 1.0
        assert cut_name in alive[3]
        assert alive[4] == {"master": "driver", cut_name: "lost", other: "running"}
        driver.wait_line(r"\[\w+\] still here$", 10)

        # Cut off, the worker notices its driver is gone and exits by itself.
        assert workers["w1"].proc.wait(timeout=ORPHANED_AFTER + 10) == 3
        orphan_exit = time.monotonic() - cut
        assert orphan_exit < ORPHANED_AFTER + 5
        print(f"cut-off worker exited {orphan_exit:.1f} s after the cut")
        assert "sent nothing for" in workers["w1"].output()
    finally:
        net.plug("w1")

    # The lost member no longer holds up the group: a new worker joins and works.
    address, token = _join_address(driver)
    fresh = hosts.worker("w2", "--join", address, "--token", token, "--name", "fresh")
    assert driver.run(
        "deadline = time.monotonic() + 120\n"
        "while not [w for w in cluster.workers if w.name == 'fresh' and w.state == 'running']:\n"
        "    assert time.monotonic() < deadline, 'fresh never joined'\n    time.sleep(0.1)\n"
        "result = rpc.rpc_sync('fresh', os.getpid)", timeout=START) == fresh.pid

    began = time.monotonic()
    assert driver.run("cluster.shutdown()\nresult = nbrpc.group.membership.member_names()") == ["master"]
    assert time.monotonic() - began < SHUTDOWN_LIMIT
    assert workers["w2"].proc.wait(timeout=10) == 0
    assert fresh.proc.wait(timeout=10) == 0


def test_driver_killed_remote_workers_exit(hosts):
    driver = hosts.driver()
    workers = _start_attached(hosts, driver, {"w1": "a", "w2": "b"})
    assert driver.run("result = [rpc.rpc_sync(n, os.getpid) for n in ('a', 'b')]") == [
        workers["w1"].pid, workers["w2"].pid]
    os.kill(driver.pid, signal.SIGKILL)
    killed = time.monotonic()
    left = wait_gone([w.pid for w in workers.values()], DRIVER_DEATH_EXIT)
    took = time.monotonic() - killed
    assert not left, f"workers outlived the killed driver by {DRIVER_DEATH_EXIT} s"
    print(f"remote workers exited {took:.2f} s after the driver was killed")
    for w in workers.values():
        assert w.proc.wait(timeout=5) == 3
        assert "closed its connection" in w.output()


# -- SSH -------------------------------------------------------------------------------

SSHD_CONFIG = """\
ListenAddress {address}
Port 22
HostKey {folder}/host_key
PidFile {folder}/sshd.pid
AuthorizedKeysFile {folder}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
"""

SSH_CONFIG = """\
Host hostb
    HostName {address}
    User root
    IdentityFile {folder}/client_key
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile {folder}/known_hosts
    LogLevel ERROR
"""


@pytest.fixture
def sshd(hosts, tmp_path):
    """An OpenSSH server on host w2 that takes a key made for this test."""
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")) or not shutil.which("ssh-keygen"):
        pytest.skip("the SSH test needs openssh-server and openssh-client (apt-get install)")
    folder = tmp_path / "ssh"
    folder.mkdir()
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / key)], check=True)
    (folder / "authorized_keys").write_text((folder / "client_key.pub").read_text())
    address = hosts.net.address["w2"]
    (folder / "sshd_config").write_text(SSHD_CONFIG.format(address=address, folder=folder))
    (folder / "ssh_config").write_text(SSH_CONFIG.format(address=address, folder=folder))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation
    server = hosts.process("w2", ["/usr/sbin/sshd", "-D", "-e", "-f", str(folder / "sshd_config")], "sshd")
    server.wait_output("Server listening on", 30)
    return f"ssh -F {folder / 'ssh_config'}"


def test_ssh_hosts(hosts, sshd, pids):
    driver = hosts.driver()
    driver.run(SETUP + "from IPython.core.interactiveshell import InteractiveShell\n"
               "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'nbrpc')")
    driver.run(f"ip.run_line_magic('rpc_init', '--hosts hostb:2 --ssh \"{sshd}\" "
               f"--timeout {RPC_TIMEOUT:g} --startup-timeout {START:g}')", timeout=START + 30)
    rows = driver.run("c = nbrpc.current()\n"
                      "result = [(w.name, w.ip, w.pid, w.state, w.launcher.pid) for w in c.workers]")
    rows.sort()  # the workers are listed as they joined, in either order
    assert [(name, ip, state) for name, ip, _, state, _ in rows] == [
        ("worker1", hosts.net.address["w2"], "running"), ("worker2", hosts.net.address["w2"], "running")]
    remote = [pid for _, _, pid, _, _ in rows]
    local_ssh = [pid for *_, pid in rows]
    pids.add(*remote, *local_ssh)
    assert driver.run("result = [rpc.rpc_sync(n, os.getpid) for n in ('worker1', 'worker2')]") == remote
    driver.run("ip.run_cell_magic('rpc_on', 'worker2', 'print(\"over ssh\")')")
    driver.wait_line(r"\[worker2\] over ssh$", 10)
    # The token went over stdin, not on a command line anyone can read.
    for pid in remote:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            assert b"--token\0-\0" in f.read() + b"\0"

    began = time.monotonic()
    driver.run("ip.run_line_magic('rpc_shutdown', '')")
    assert time.monotonic() - began < SHUTDOWN_LIMIT
    assert not wait_gone(remote + local_ssh, 10), "workers or ssh processes survived shutdown"


def test_waits_and_stacks_of_an_ssh_worker_whose_rpc_threads_are_all_blocked(hosts, sshd, pids):
    """A worker on another host answers ``nbrpc.waits()`` and ``nbrpc.stacks()`` over its
    kernel's control channel while each of its RPC threads waits on an event; frozen, it
    is reported so within a second."""
    threads = 2
    driver = hosts.driver()
    driver.run(SETUP + "import threading\nfrom IPython.core.interactiveshell import InteractiveShell\n"
               "ip = InteractiveShell.instance()\nip.run_line_magic('load_ext', 'nbrpc')")
    driver.run(f"ip.run_line_magic('rpc_init', '--hosts hostb:1 --ssh \"{sshd}\" --threads {threads} "
               f"--timeout {RPC_TIMEOUT:g} --startup-timeout {START:g}')", timeout=START + 30)
    (remote, ssh_pid), = driver.run("c = nbrpc.current()\nresult = [(w.pid, w.launcher.pid) for w in c.workers]")
    pids.add(remote, ssh_pid)
    # nbrpc's hand-off to threads of its own (calls.serving) off: torch's pool is exhausted.
    driver.run("c.serve_on_torch_threads(True, 'worker1')")
    # Through the shell, as a notebook's cell: the worker's stacks then show its lines.
    cell = ("import threading\nimport torch.distributed.rpc as rpc\ngate = threading.Event()\n"
            "def park():\n    gate.wait(60)\n    return 3\n"
            f"futs = [rpc.rpc_async('worker1', park) for _ in range({threads + 1})]\n")
    driver.run(f"done = ip.run_cell({cell!r})\ndone.raise_error()\nfuts = ip.user_ns['futs']")
    look = ("began = time.monotonic()\nsnap = nbrpc.waits()\nwaits_took = time.monotonic() - began\n"
            "began = time.monotonic()\nstacks = nbrpc.stacks()\nstacks_took = time.monotonic() - began\n"
            "result = [waits_took, stacks_took, snap, stacks]")
    try:
        deadline = time.monotonic() + 30
        while True:
            waits_took, stacks_took, snap, stacks = driver.run(look)
            found = [f for f in snap["findings"] if f["kind"] == "pool_exhausted"]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found, snap
        assert waits_took < 1.0 and stacks_took < 1.0, (waits_took, stacks_took)
        print(f"remote member: waits() {waits_took:.3f} s, stacks() {stacks_took:.3f} s")
        worker1 = next(m for m in snap["members"] if m["name"] == "worker1")
        assert (worker1["state"], worker1["threads"], worker1["busy"]) == ("running", threads, threads)
        assert found[0]["members"] == ["worker1"]
        assert f"all {threads} RPC threads of worker1 are busy (running park)" in found[0]["message"]
        blocked = [c for c in snap["calls"] if c["callee"] == "worker1" and c.get("blocked_at")]
        assert len(blocked) == threads and {c["function"] for c in blocked} == {"park"}
        assert {c["blocked_at"]["code"] for c in blocked} == {"gate.wait(60)"}
        assert (stacks["worker1"]["state"], stacks["worker1"]["pid"]) == ("running", remote)
        serving = [t for t in stacks["worker1"]["threads"] if t["serving"] == "park"]
        assert len(serving) == threads
        for thread in serving:
            cells = [f for f in thread["frames"] if "cell" in f]
            assert cells[-1]["code"] == "gate.wait(60)" and cells[-1]["function"] == "park"
    finally:
        driver.run("c.run('gate.set()', 'worker1')")
    assert driver.run("result = [f.wait() for f in futs]", timeout=RPC_TIMEOUT) == [3] * (threads + 1)

    # Frozen on its host (the driver cannot see its process): no answer, within a second.
    os.kill(remote, signal.SIGSTOP)
    try:
        for _ in range(2):  # the second look does not wait on it again
            waits_took, stacks_took, snap, stacks = driver.run(look)
            assert waits_took < 1.0 and stacks_took < 1.0, (waits_took, stacks_took)
            assert [m["state"] for m in snap["members"] if m["name"] == "worker1"] == ["frozen"]
            assert stacks["worker1"]["state"] == "frozen"
            assert stacks["worker1"]["why"].startswith("no answer within ")
    finally:
        os.kill(remote, signal.SIGCONT)
    assert driver.run("deadline = time.monotonic() + 10\n"
                      "while nbrpc.stacks(['worker1'])['worker1']['state'] != 'running':\n"
                      "    assert time.monotonic() < deadline\n    time.sleep(0.1)\n"
                      "result = rpc.rpc_sync('worker1', os.getpid)") == remote
    driver.run("ip.run_line_magic('rpc_shutdown', '')")
    assert not wait_gone([remote, ssh_pid], 10), "the worker or its ssh process survived shutdown"


# -- launchers of other people: torchrun ------------------------------------------------


def test_torchrun_starts_attached_workers(hosts):
    """The torchrun recipe of docs/guide/other-machines.md: torchrun starts the processes, nbrpc does the rest."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    nbrpc_command = os.path.join(os.path.dirname(sys.executable), "nbrpc")
    driver = hosts.driver()
    driver.send(SETUP + f"cluster = nbrpc.Cluster(attach=2, bind={hosts.net.address['drv']!r}, "
                f"timeout={RPC_TIMEOUT}, startup_timeout={START}, progress=None)\ncluster.start()")
    address, token = _join_address(driver)
    launcher = hosts.process("w1", ["env", f"NBRPC_TOKEN={token}", torchrun, "--standalone",
                                    "--nproc-per-node", "2", "--no-python", nbrpc_command,
                                    "worker", "--join", address], "torchrun")
    driver.reply(START)
    rows = driver.run("result = sorted((w.name, w.ip, rpc.rpc_sync(w.name, os.getpid)) for w in cluster.workers)")
    assert [(name, ip) for name, ip, _ in rows] == [("worker1", hosts.net.address["w1"]),
                                                   ("worker2", hosts.net.address["w1"])]
    driver.run("cluster.shutdown()")
    assert launcher.proc.wait(timeout=30) == 0, launcher.output()[-3000:]
