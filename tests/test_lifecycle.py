"""Lifecycle and failures, with real processes: shutdown, restart, a killed driver,
a restarted notebook kernel, a killed worker, workers that fail to start, Ctrl-C
during a long call, and ``%rpc_init`` while a cluster runs.

Every process a test starts is recorded by pid (with its start time, so a reused
pid is never touched); finalizers end them gently, SIGKILL survivors and assert
they are gone.
"""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import socket
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import Pids, wait_gone, wait_until

import nbrpc
from nbrpc._compat import torch_compat
from nbrpc._util import listening_ports, pid_alive, process_usage

# The contract's numbers, and margins for a loaded two-core machine.
DRIVER_DEATH_EXIT = 10.0
SHUTDOWN_LIMIT = 30.0
INTERRUPT_LIMIT = 2.5
SUBPROCESS_START = 120.0

DRIVER_THEN_SLEEP = """
import json, time
import nbrpc

cluster = nbrpc.start(2, progress=None)
print(json.dumps({"pids": [w.pid for w in cluster.workers]}), flush=True)
time.sleep(600)
"""

DRIVER_INTERRUPTED = """
import json, os, time
import torch.distributed.rpc as rpc
import nbrpc

cluster = nbrpc.start(2, progress=None, timeout=120)
print(json.dumps({"pids": [w.pid for w in cluster.workers]}), flush=True)
print(json.dumps({"calling": True}), flush=True)
began = time.monotonic()
try:
    rpc.rpc_sync("worker1", time.sleep, args=(60,))
    print(json.dumps({"returned": time.monotonic() - began}), flush=True)
except KeyboardInterrupt:
    print(json.dumps({"interrupted_after": time.monotonic() - began}), flush=True)
began = time.monotonic()
cluster.shutdown()
print(json.dumps({"shutdown_took": time.monotonic() - began,
                  "current": repr(nbrpc.current())}), flush=True)
"""

DRIVER_LISTENER_POKED = """
import json, os, socket, time
import nbrpc
from nbrpc.group import membership
from nbrpc._util import listening_ports

cluster = nbrpc.start(2, progress=None)
print(json.dumps({"pids": [w.pid for w in cluster.workers]}), flush=True)
cluster.shutdown()
for port in sorted(membership.GROUP.driver.listeners):  # a port scan: connect, close at once
    try:
        socket.create_connection(("127.0.0.1", port)).close()
    except ConnectionRefusedError:  # closed by the scan's earlier connections
        pass
time.sleep(1)
began = time.monotonic()
try:
    nbrpc.start(1, progress=None, startup_timeout=60)
    print(json.dumps({"second": "started"}), flush=True)
except nbrpc.ClusterRunningError as e:
    print(json.dumps({"second": str(e), "after": time.monotonic() - began}), flush=True)
"""


# -- process bookkeeping -----------------------------------------------------------


@pytest.fixture
def clusters(pids):
    """Factory: ``clusters(**options)`` builds a Cluster whose pids are tracked."""
    made: list[nbrpc.Cluster] = []

    def make(n: int = 2, **options) -> nbrpc.Cluster:
        options.setdefault("progress", None)
        cluster = nbrpc.Cluster(n, **options)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        pids.add(*(w.pid for w in cluster._workers if w.pid is not None))
        cluster.shutdown()


def _start(cluster: nbrpc.Cluster, pids: Pids) -> list[int]:
    try:
        cluster.start()
    finally:
        pids.add(*(w.pid for w in cluster._workers if w.pid is not None))
    return [w.pid for w in cluster.workers]


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        items = [x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x]
    return {k.decode(): v.decode(errors="replace") for k, v in items}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def shell(ip, pids):
    """The IPython shell; a cluster the test left running is shut down after it."""
    yield ip
    if nbrpc.current() is not None:
        pids.add(*(w.pid for w in nbrpc.current()._workers))
        nbrpc.current().shutdown()


def _rpc_pids() -> list[int]:
    """Each worker's pid as it answers ``os.getpid`` over RPC (a real round trip)."""
    return [rpc.rpc_sync(name, os.getpid) for name in ("worker1", "worker2")]


def _assert_ended(cluster: nbrpc.Cluster, worker_pids: list[int]) -> None:
    """After shutdown: no worker process, no cluster, its workers gone from the group.

    The driver stays a member of RPC for the life of its process (torch binds RRefs
    to the first agent), with nobody else in the group.
    """
    assert [p for p in worker_pids if pid_alive(p)] == []
    assert nbrpc.current() is None
    assert cluster.state == "stopped"
    assert nbrpc.group.membership.member_names() == [cluster.driver_name]
    with pytest.raises(nbrpc.UnknownWorkerError, match="worker1"):
        rpc.rpc_sync("worker1", os.getpid)
    with pytest.raises(nbrpc.NoClusterError):
        cluster.run("1")


# -- shutdown and restart -----------------------------------------------------------


def test_shutdown_ends_rpc_and_workers_and_restarts_three_times(clusters, pids):
    store_ports = []
    for _ in range(3):
        cluster = clusters()
        worker_pids = _start(cluster, pids)
        assert nbrpc.current() is cluster
        assert _rpc_pids() == worker_pids
        store_ports.append(cluster._store.port)
        assert _listening(store_ports[-1])

        began = time.monotonic()
        cluster.shutdown()
        assert time.monotonic() - began < SHUTDOWN_LIMIT
        _assert_ended(cluster, worker_pids)
        assert {w.state for w in cluster.workers} == {"stopped"}
        # Every worker process is reaped, not left as a zombie.
        assert None not in [w.exit_code() for w in cluster.workers]
        cluster.shutdown()  # a second call is harmless
    # One store serves the driver's group for the life of the process.
    assert len(set(store_ports)) == 1 and _listening(store_ports[0])


def test_a_new_cluster_is_sent_notebook_code_in_full_again(clusters, pids):
    """A worker of the next cluster is a new process under an old name: what the last
    one was sent by digest, the new one must get in full."""
    from nbrpc.wire.definitions import receivers

    main = sys.modules["__main__"].__dict__
    exec("def plus_one(x):\n    return x + 1", main)  # a notebook definition: __main__'s
    try:
        for _ in range(2):
            cluster = clusters(n=1)
            _start(cluster, pids)
            assert [rpc.rpc_sync("worker1", main["plus_one"], args=(i,)) for i in range(3)] == [1, 2, 3]
            assert receivers.known.get("worker1")  # acknowledged: later calls went by digest
            cluster.shutdown()
            assert receivers.known == {}
    finally:
        del main["plus_one"]


def test_shutdown_lets_calls_between_workers_end_and_leaves_no_member(clusters, pids):
    """Every worker deletes its RRefs and lets its own calls end at once, then all end
    together and the driver forgets them: the next cluster joins under the same names."""
    cluster = clusters(n=3)
    _start(cluster, pids)
    cluster.run("import torch.distributed.rpc as rpc, time\n"
                "fut = rpc.rpc_async('worker2', time.sleep, args=(0.5,))", "worker1")
    held = rpc.remote("worker3", torch.ones, args=((2,),))
    assert held.to_here().tolist() == [1.0, 1.0]
    cluster.shutdown()
    assert nbrpc.group.membership.member_names() == [cluster.driver_name]
    members = torch.distributed.PrefixStore(cluster._driver.prefix, cluster._driver.store)
    token = nbrpc.group.membership.TOKEN
    assert not members.check([token]) or members.get(token) == b""  # the join/leave lock is free
    del held
    _start_works_after(clusters, pids)


def test_rrefs_end_with_their_cluster(clusters, pids, capfd):
    """As a cluster ends every member deletes its RRefs at once: an RRef dropped later
    asks no owner that is gone (torch printed an error and a C++ stack for each), and
    a value the driver owns is no longer kept for a worker that left."""
    cluster = clusters()
    _start(cluster, pids)
    mine = rpc.RRef(torch.zeros(3))
    theirs = rpc.remote("worker1", torch.ones, args=((2,),))
    holder = rpc.remote("worker2", list, args=([mine],))  # worker2 keeps a fork of mine
    assert theirs.to_here().sum().item() == 2.0 and len(holder.to_here()) == 1
    assert torch_compat.rref_debug_info()["num_owner_rrefs"] == "1"
    cluster.shutdown()
    info = torch_compat.rref_debug_info()
    assert (info["num_owner_rrefs"], info["num_pending_users"]) == ("0", "0")
    capfd.readouterr()
    del theirs, holder
    gc.collect()
    assert "Error occurred when deleting" not in capfd.readouterr().err
    assert mine.local_value().tolist() == [0.0, 0.0, 0.0]  # still the driver's own


def test_magics_shutdown_then_init_three_times(shell, pids, capsys):
    for cycle in range(3):
        shell.run_line_magic("rpc_init", "-n 2")
        cluster = nbrpc.current()
        assert cluster is not None and cluster.state == "running"
        worker_pids = [w.pid for w in cluster.workers]
        pids.add(*worker_pids)

        if cycle == 0:
            with pytest.raises(nbrpc.ClusterRunningError, match="already running"):
                shell.run_line_magic("rpc_init", "-n 2")
            assert nbrpc.current() is cluster
            assert all(pid_alive(p) for p in worker_pids)

        result = shell.run_cell(
            "import os\nimport torch.distributed.rpc as rpc\n"
            "double = lambda x: (os.getpid(), 2 * x)\n"
            "answers = [rpc.rpc_sync(w, double, args=(21,)) for w in ('worker1', 'worker2')]"
        )
        result.raise_error()
        assert shell.user_ns["answers"] == [(worker_pids[0], 42), (worker_pids[1], 42)]

        capsys.readouterr()
        shell.run_cell_magic("rpc_on", "worker2", "import os; print('pid', os.getpid())")
        assert f"[worker2] pid {worker_pids[1]}" in capsys.readouterr().out

        rows = shell.run_line_magic("rpc_status", "").rows
        assert [(r["name"], r["pid"], r["state"]) for r in rows] == [
            ("master", os.getpid(), "driver"),
            ("worker1", worker_pids[0], "running"),
            ("worker2", worker_pids[1], "running"),
        ]

        shell.run_line_magic("rpc_shutdown", "")
        _assert_ended(cluster, worker_pids)


# -- the driver goes away -------------------------------------------------------------


def test_driver_killed_workers_exit(drivers):
    driver = drivers(DRIVER_THEN_SLEEP)
    workers = driver.worker_pids()
    assert {_environ(p)["NBRPC_DRIVER_PID"] for p in workers} == {str(driver.proc.pid)}
    folders = {os.path.dirname(_connection_file(p)) for p in workers}
    assert all(os.path.isdir(f) for f in folders) and len(folders) == len(workers)

    os.kill(driver.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert driver.proc.wait(timeout=10) == -signal.SIGKILL
    survivors = wait_gone(workers, timeout=DRIVER_DEATH_EXIT)
    assert not survivors, f"workers outlived the killed driver by {DRIVER_DEATH_EXIT} s"
    assert time.monotonic() - killed < DRIVER_DEATH_EXIT + 1
    # each took its folder (connection file, log, kernel sockets) with it
    assert not [f for f in folders if os.path.exists(f)]


def _connection_file(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return argv[argv.index("-f") + 1]


def _execute(kc, code: str, timeout: float = SUBPROCESS_START) -> str:
    """Run ``code`` in the kernel; return its stdout; fail with its error."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    content = reply["content"]
    assert content["status"] == "ok", f"{content.get('ename')}: {content.get('evalue')}"
    return "".join(out)



@pytest.mark.slow
def test_kernel_restart_ends_workers(kernel, pids):
    km, kc = kernel
    kernel_pid = km.provisioner.pid
    _execute(kc, "%load_ext nbrpc")
    _execute(kc, "%rpc_init -n 2")
    workers = json.loads(_execute(
        kc, "import json, nbrpc; print(json.dumps([w.pid for w in nbrpc.current().workers]))"
    ))
    pids.add(*workers)
    assert len(workers) == 2 and all(pid_alive(p) for p in workers)
    assert {_environ(p)["NBRPC_DRIVER_PID"] for p in workers} == {str(kernel_pid)}

    # The stop button during a long call gives the kernel back promptly. A remote error
    # first: IPython's first traceback through torch's rpc/api.py parses that file (0.4-0.5 s
    # here, as under raw torch), which the interrupted call's traceback would otherwise pay.
    # Both cells that fail leave the queue as it is (stop_on_error=False): ipykernel 7 replies
    # to a failed cell before it stops aborting what is queued, so a request sent at once after
    # the reply may be aborted (ipykernel issue 609's race).
    _execute(kc, "import time\nimport torch.distributed.rpc as rpc")
    failed = kc.execute_interactive("rpc.rpc_sync('worker1', int, args=('x',))", timeout=60,
                                    stop_on_error=False)["content"]
    assert (failed["status"], failed["ename"]) == ("error", "ValueError")
    msg_id = kc.execute("rpc.rpc_sync('worker1', time.sleep, args=(60,))", stop_on_error=False)
    time.sleep(1.0)
    km.interrupt_kernel()
    interrupted = time.monotonic()
    reply = kc.get_shell_msg(timeout=10)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert time.monotonic() - interrupted < INTERRUPT_LIMIT
    assert (reply["content"]["status"], reply["content"]["ename"]) == ("error", "KeyboardInterrupt")
    assert _execute(kc, "print(rpc.rpc_sync('worker2', pow, args=(3, 4)))").strip() == "81"

    began = time.monotonic()
    km.restart_kernel(now=True)
    survivors = wait_gone(workers, timeout=began + DRIVER_DEATH_EXIT - time.monotonic())
    assert not survivors, f"workers outlived the kernel restart by {DRIVER_DEATH_EXIT} s"
    assert not pid_alive(kernel_pid)

    # The new kernel is a clean slate.
    new_pid = km.provisioner.pid
    pids.add(new_pid)
    assert new_pid != kernel_pid
    kc.wait_for_ready(timeout=SUBPROCESS_START)
    assert _execute(kc, "import nbrpc; print(nbrpc.current())").strip() == "None"


# -- a worker goes away ---------------------------------------------------------------


def test_worker_killed(clusters, pids, shell):
    rpc_timeout = 20.0
    cluster = clusters(timeout=rpc_timeout)
    w1, w2 = _start(cluster, pids)
    assert _rpc_pids() == [w1, w2]

    # The kill lands while the main thread waits in a long call to that worker.
    killer = threading.Timer(1.0, os.kill, args=(w1, signal.SIGKILL))
    began = time.monotonic()
    killer.start()
    with pytest.raises(nbrpc.WorkerDiedError, match="worker 'worker1'") as pending:
        rpc.rpc_sync("worker1", time.sleep, args=(60,))
    killer.join()
    assert time.monotonic() - began < rpc_timeout
    assert f"(pid {w1}) was killed by signal 9" in str(pending.value)

    # A new call fails at once, naming it.
    began = time.monotonic()
    with pytest.raises(nbrpc.WorkerDiedError, match="worker 'worker1'"):
        rpc.rpc_sync("worker1", os.getpid)
    assert time.monotonic() - began < rpc_timeout
    with pytest.raises(nbrpc.WorkerDiedError, match="worker1"):
        cluster.run("1", "worker1")

    states = {r["name"]: (r["pid"], r["state"]) for r in cluster.status()}
    assert states == {"master": (os.getpid(), "driver"), "worker1": (w1, "dead"),
                      "worker2": (w2, "running")}
    assert "dead" in repr(shell.run_line_magic("rpc_status", ""))

    assert rpc.rpc_sync("worker2", os.getpid) == w2
    assert rpc.rpc_sync("worker2", pow, args=(2, 10)) == 1024

    began = time.monotonic()
    cluster.shutdown()
    assert time.monotonic() - began < SHUTDOWN_LIMIT
    assert not wait_gone([w1, w2], timeout=0.5)
    assert nbrpc.current() is None


def test_dead_worker_is_named_by_futures_remote_and_to_here(clusters, pids):
    cluster = clusters(timeout=30)
    w1, w2 = _start(cluster, pids)
    try:
        waiting = rpc.rpc_async("worker2", time.sleep, args=(60,))
        pending = rpc.remote("worker2", time.sleep, args=(60,))
        killer = threading.Timer(1.0, os.kill, args=(w2, signal.SIGKILL))
        killer.start()
        dead = f"worker 'worker2' (pid {w2}) was killed by signal 9"
        with pytest.raises(nbrpc.WorkerDiedError, match=r"rpc_async\('worker2', sleep\) failed") as info:
            waiting.wait()
        killer.join()
        assert dead in str(info.value)
        with pytest.raises(nbrpc.WorkerDiedError, match="to_here.. of an RRef owned by 'worker2'") as info:
            pending.to_here()
        assert dead in str(info.value)
        with pytest.raises(nbrpc.WorkerDiedError, match=re.escape(dead)):
            rpc.remote("worker2", os.getpid).to_here()
        with pytest.raises(nbrpc.WorkerDiedError, match=re.escape(dead)):
            rpc.rpc_async("worker2", os.getpid).wait()
        assert rpc.rpc_async("worker1", os.getpid).wait() == w1
        assert rpc.remote("worker1", os.getpid).to_here() == w1
    finally:
        cluster.shutdown()
    assert not wait_gone([w1, w2])


# -- workers that cannot start --------------------------------------------------------

BROKEN_TORCH = 'raise ImportError("nbrpc-test-marker: this torch is broken")\n'
NEVER_JOINS = "import time\ntime.sleep(3600)\n"


def _start_fails(clusters, pids, folder, **options) -> tuple[str, float, list[int]]:
    cluster = clusters(env={"PYTHONPATH": str(folder)}, **options)
    began = time.monotonic()
    with pytest.raises(nbrpc.WorkerStartError) as failure:
        _start(cluster, pids)
    took = time.monotonic() - began
    worker_pids = [w.pid for w in cluster._workers]
    assert len(worker_pids) == 2 and None not in worker_pids
    assert not wait_gone(worker_pids, timeout=1), "a failed start left workers running"
    assert nbrpc.current() is None
    return str(failure.value), took, worker_pids


def _start_works_after(clusters, pids) -> None:
    cluster = clusters()
    worker_pids = _start(cluster, pids)
    assert _rpc_pids() == worker_pids
    cluster.shutdown()
    assert not wait_gone(worker_pids, timeout=1)


def test_worker_crashing_at_start(clusters, pids, tmp_path):
    # A broken package shadows torch in the workers only: they fail at import.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(BROKEN_TORCH)
    message, took, _ = _start_fails(clusters, pids, tmp_path, startup_timeout=60)
    assert "nbrpc-test-marker: this torch is broken" in message
    assert "ImportError" in message
    assert "exited before joining" in message
    assert "'worker1'" in message or "'worker2'" in message
    assert took < 30
    _start_works_after(clusters, pids)


@pytest.mark.slow
def test_worker_never_joining(clusters, pids, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NEVER_JOINS)
    startup_timeout = 15.0
    message, took, _ = _start_fails(clusters, pids, tmp_path, startup_timeout=startup_timeout)
    assert "worker 'worker1'" in message
    assert "did not join within startup_timeout=15 s" in message
    assert startup_timeout - 1 <= took < startup_timeout + 10
    _start_works_after(clusters, pids)


# -- interrupting and misusing a running cluster ---------------------------------------


def test_keyboard_interrupt_during_long_rpc_sync(drivers):
    driver = drivers(DRIVER_INTERRUPTED)
    workers = driver.worker_pids()
    driver.expect("calling", 10)
    time.sleep(1.0)  # the call is in flight, waiting on worker1

    os.kill(driver.proc.pid, signal.SIGINT)
    signalled = time.monotonic()
    record = driver.expect("interrupted_after", 10)
    assert time.monotonic() - signalled < INTERRUPT_LIMIT
    assert 1.0 <= record["interrupted_after"] < 1.0 + INTERRUPT_LIMIT + 2

    done = driver.expect("shutdown_took", SHUTDOWN_LIMIT + 5)
    assert done["shutdown_took"] < SHUTDOWN_LIMIT
    assert done["current"] == "None"
    assert driver.proc.wait(timeout=10) == 0
    assert not wait_gone(workers, timeout=1)


def test_a_driver_whose_listener_stopped_says_so(drivers):
    driver = drivers(DRIVER_LISTENER_POKED)
    driver.worker_pids()
    record = driver.expect("second", SUBPROCESS_START)
    assert "stopped accepting connections" in record["second"]
    assert "restart the kernel" in record["second"]
    assert record["after"] < 1.0  # at once, not after the start-up timeout
    assert driver.proc.wait(timeout=30) == 0


def test_tracking_off_and_on_again(clusters, pids):
    from nbrpc.recording import rref_ledger

    cluster = clusters(1, track=False)
    _start(cluster, pids)
    # off: torch's own RRef constructor, and the ledger keeps nothing
    assert not rref_ledger.is_tracking() and rpc.PyRRef.__init__ is torch_compat.rref_init
    held = rpc.remote("worker1", torch.ones, args=((2,),))
    with pytest.raises(RuntimeError, match="tracking is off .* track=False"):
        nbrpc.rref_snapshot()
    assert rpc.rpc_sync("worker1", rref_ledger.is_tracking) is False
    del held
    cluster.shutdown()

    cluster = clusters(1)
    _start(cluster, pids)
    held = rpc.remote("worker1", torch.ones, args=((2,),))
    assert [r["summary"] for r in nbrpc.rref_snapshot()["rrefs"]] == ["Tensor[2] float32"]
    assert rpc.rpc_sync("worker1", rref_ledger.is_tracking) is True
    assert rpc.PyRRef.__init__ is rref_ledger._init
    del held


# -- a frozen worker at shutdown, the driver's name across clusters ---------------------


def test_frozen_worker_at_shutdown_leaves_the_group_usable(clusters, pids):
    cluster = clusters(timeout=5)
    w1, w2 = _start(cluster, pids)
    os.kill(w2, signal.SIGSTOP)
    # worker1's graceful leave takes torch's membership lock, then blocks on the
    # frozen worker2: it is killed holding the lock.
    cluster.worker("worker1").client.execute("import nbrpc.member.worker; nbrpc.member.worker.leave()", silent=True)
    members = torch.distributed.PrefixStore(cluster._driver.prefix, cluster._driver.store)
    token = nbrpc.group.membership.TOKEN
    assert wait_until(lambda: members.check([token]) and members.get(token), 30), \
        "worker1 never took the membership lock"
    assert members.get(nbrpc.group.membership.TOKEN) == b"Token_for_worker1_leave"

    began = time.monotonic()
    cluster.shutdown()
    assert time.monotonic() - began < SHUTDOWN_LIMIT
    _assert_ended(cluster, [w1, w2])
    assert members.get(nbrpc.group.membership.TOKEN) == b""
    _start_works_after(clusters, pids)


def test_frozen_worker_is_not_waited_for(clusters, pids):
    cluster = clusters(timeout=5)
    w1, w2 = _start(cluster, pids)
    os.kill(w2, signal.SIGSTOP)
    cluster.shutdown()
    _assert_ended(cluster, [w1, w2])
    _start_works_after(clusters, pids)


DRIVER_NAMED_THEN_DEFAULT = """
import contextlib, io, json, os
import torch.distributed.rpc as rpc
from IPython.testing.globalipapp import start_ipython
import nbrpc

ip = start_ipython()
ip.run_line_magic("load_ext", "nbrpc")
ip.run_line_magic("rpc_init", "--names p1,p2 --driver-name p0")
ip.run_line_magic("rpc_shutdown", "")
said = io.StringIO()
with contextlib.redirect_stderr(said):
    ip.run_line_magic("rpc_init", "-n 2")
cluster = nbrpc.current()
print(json.dumps({"pids": [w.pid for w in cluster.workers]}), flush=True)
print(json.dumps({"driver": cluster.driver_name, "said": said.getvalue(),
                  "me": rpc.get_worker_info().name,
                  "seen": rpc.rpc_sync("worker1", rpc.get_worker_info, args=("p0",)).name}), flush=True)
ip.run_line_magic("rpc_shutdown", "")
try:
    nbrpc.Cluster(1, driver_name="other", progress=None).start()
except ValueError as e:
    print(json.dumps({"refused": str(e)}), flush=True)
print(json.dumps({"current": repr(nbrpc.current())}), flush=True)
"""


def test_default_driver_name_keeps_the_name_of_an_earlier_cluster(drivers):
    driver = drivers(DRIVER_NAMED_THEN_DEFAULT)
    workers = driver.worker_pids()
    record = driver.expect("driver", 60)
    assert record["driver"] == record["me"] == record["seen"] == "p0"
    assert "p0 + worker1, worker2 up in" in record["said"]
    assert "'p0' kept from an earlier cluster" in record["said"]
    refused = driver.expect("refused", SHUTDOWN_LIMIT)["refused"]
    assert "joined RPC as 'p0'" in refused and "--driver-name p0" in refused
    assert driver.expect("current", 30)["current"] == "None"
    assert driver.proc.wait(timeout=30) == 0
    assert not wait_gone(workers, timeout=5)


def test_repeated_clusters_keep_the_driver_bounded(clusters, pids):
    """A leak check, not a timing check: what the driver keeps per cluster stays small,
    and none of its connections to a cluster's workers outlives them (torch kept 4
    half-closed sockets for every worker the driver had called; ``make bench`` measures
    20 cycles)."""
    usage = []
    for _ in range(4):
        cluster = clusters()
        worker_pids = _start(cluster, pids)
        assert [rpc.rpc_sync(name, os.getpid) for name in ("worker1", "worker2")] == worker_pids
        ports = set().union(*(listening_ports(pid) for pid in worker_pids))
        assert _connections_to(ports), "the calls left no connection to check"
        cluster.shutdown()
        assert wait_until(lambda ports=ports: not _connections_to(ports), timeout=5), \
            f"the driver kept connections to workers that ended: {_connections_to(ports)}"
        usage.append(process_usage())
    first, last = usage[0], usage[-1]
    assert last["descriptors"] - first["descriptors"] <= 3
    assert last["rss_mib"] - first["rss_mib"] <= 3 * 30
    assert last["threads"] - first["threads"] <= 2


def _connections_to(ports: set[int]) -> list[tuple]:
    """This process's TCP connections whose far end is one of ``ports``, with their state."""
    return [(c.raddr.port, c.status) for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port in ports]


@pytest.mark.slow
def test_rpc_shutdown_in_a_notebook_shows_no_pipe_warnings(kernel):
    # The workers close their pipes as they finish exiting, after %rpc_shutdown returns;
    # TensorPipe's warning for each ("encountered error when reading incoming request")
    # must land neither in that cell nor in the next ones.
    from conftest import execute, streamed

    km, kc = kernel
    for _ in range(3):
        # Memory to give back makes each worker's exit take a while, as on a busy machine.
        _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 4", timeout=180)
        assert reply["status"] == "ok", reply
        _, reply = execute(kc, "%%rpc_on all\nimport torch\nheld = torch.ones(128 * 2**20)")
        assert reply["status"] == "ok", reply
        shutdown, _ = execute(kc, "%rpc_shutdown", timeout=120)
        after, _ = execute(kc, "import time\ntime.sleep(1.5)")
        assert "shut down" in streamed(shutdown)
        assert streamed(shutdown, "stderr") == streamed(after, "stderr") == ""
