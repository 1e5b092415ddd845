"""Hangs named while they happen: ``nbrpc.waits()``, ``nbrpc.stacks()``, ``%rpc_stacks``.

Each hang is staged for real in a cluster of real worker kernels (worker1, worker2,
four RPC threads each): the cell that waits runs in a thread of this process (as a
notebook's cell, through IPython's shell, so its frames are cells), while the test
asks the cluster what it waits on. The stuck cell's own display, in a real notebook
kernel, and the pool deadlock across two workers (which torch leaves its process unfit
for another cluster after) are in ``test_waits_kernel.py``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import types

import pytest
import torch
from conftest import Cell, as_main, finding, run, wait_gone, wait_until
from IPython.core.error import UsageError

import nbrpc

THREADS = 4


@pytest.fixture(scope="module")
def cluster():
    c = nbrpc.start(2, progress=None, timeout=30, threads=THREADS)
    pids = [w.pid for w in c.workers]
    yield c
    c.shutdown()
    assert not wait_gone(pids), "shutdown left worker processes running"


@pytest.fixture(scope="module")
def shell(ip, cluster):
    with as_main(ip):
        run(ip, "import threading, time\nimport torch\nimport torch.distributed.rpc as rpc")
        yield ip


def test_no_cluster_is_a_clear_error():
    assert nbrpc.current() is None
    with pytest.raises(nbrpc.NoClusterError, match=r"no nbrpc cluster is running.*%rpc_init"):
        nbrpc.waits()
    with pytest.raises(nbrpc.NoClusterError):
        nbrpc.stacks()


def test_idle_cluster_has_no_calls_and_no_findings(cluster):
    snap = nbrpc.waits()
    json.dumps(snap)  # JSON-serializable, as docs/guide/hangs.md says
    assert [m["name"] for m in snap["members"]] == [cluster.driver_name, "worker1", "worker2"]
    assert all(m["state"] == "running" and m["threads"] == THREADS for m in snap["members"])
    assert snap["calls"] == [] and snap["findings"] == []


def test_lock_held_across_a_nested_call(shell):
    run(shell, "lock = threading.Lock()\n"
               "def inner():\n"
               "    with lock:\n"
               "        return 1\n"
               "def outer():\n"
               "    with lock:\n"
               "        return rpc.rpc_sync('worker1', inner, timeout=8)\n")
    cell = Cell(shell, "rpc.rpc_sync('worker1', outer, timeout=6)")
    found, took, snap = finding("blocked")
    assert found is not None, snap
    assert took < 3.0
    message = found["message"]
    assert "worker1 runs outer (cell " in message
    assert "which waits on its call to inner on worker1, blocked at `with lock:` (cell " in message
    assert found["members"] == [nbrpc.current().driver_name, "worker1"]
    calls = {c["function"]: c for c in snap["calls"]}
    assert calls["outer"]["state"] == "waiting" and calls["outer"]["waits_on"] == [calls["inner"]["id"]]
    assert calls["inner"]["blocked_at"]["what"] == "lock"
    assert calls["inner"]["blocked_at"]["code"] == "with lock:"
    assert calls["outer"]["site"].startswith("cell ")
    # The timeout says what the callee was doing when the caller gave up.
    cell.join()
    assert isinstance(cell.error, nbrpc.RpcTimeoutError)
    text = str(cell.error)
    assert "got no answer within 6 s" in text
    assert "When it stopped: worker1 runs outer (cell " in text
    assert "blocked at `with lock:` (cell " in text
    # worker1 gets its threads back once its own call times out.
    assert wait_until(lambda: not nbrpc.waits()["calls"], 15, interval=0.5)


def test_to_here_on_a_call_that_waits_on_its_caller(shell, cluster):
    run(shell, "held = threading.Lock()\n"
               "def from_driver():\n"
               "    with held:\n"
               "        return 2\n"
               "def calls_back():\n"
               f"    return rpc.rpc_sync({cluster.driver_name!r}, from_driver, timeout=6)\n")
    cell = Cell(shell, "with held:\n"
                       "    rref = rpc.remote('worker2', calls_back)\n"
                       "    rref.to_here(timeout=5)\n")
    found, took, snap = finding("waits_on_caller")
    assert found is not None, snap
    assert took < 3.0
    driver = cluster.driver_name
    assert found["message"].startswith(f"{driver} waits on to_here on worker2 (cell ")
    assert "which waits on calls_back on worker2" in found["message"]
    assert f"which waits on its call to from_driver on {driver}, blocked at `with held:` (cell " in found["message"]
    cell.join()
    assert isinstance(cell.error, nbrpc.RpcTimeoutError)
    assert wait_until(lambda: not nbrpc.waits()["calls"], 15, interval=0.5)


def test_stacks_while_every_rpc_thread_of_a_worker_is_blocked(shell, cluster):
    # nbrpc hands calls to threads of its own once torch's run short (calls.serving), so
    # that blocking functions cannot exhaust torch's pool: staged here with that off.
    cluster.serve_on_torch_threads(True, "worker1")
    run(shell, "gate = threading.Event()\n"
               "def park():\n"
               "    gate.wait(30)\n"
               "    return 3\n")
    cell = Cell(shell, f"futs = [rpc.rpc_async('worker1', park) for _ in range({THREADS + 1})]\n"
                       "[f.wait() for f in futs]")
    try:
        assert wait_until(lambda: sum(1 for c in nbrpc.waits()["calls"] if c.get("blocked_at")) == THREADS,
                          10, interval=0.2)
        began = time.monotonic()
        stacks = nbrpc.stacks()
        took = time.monotonic() - began
        assert took < 1.0
        assert set(stacks) == {cluster.driver_name, "worker1", "worker2"}
        serving = [t for t in stacks["worker1"]["threads"] if t["serving"] == "park"]
        assert len(serving) == THREADS
        for thread in serving:
            cells = [f for f in thread["frames"] if "cell" in f]
            assert cells[-1]["code"] == "gate.wait(30)" and cells[-1]["function"] == "park"
            assert cells[-1]["cell"].startswith("cell ")
        # The fifth call waits behind them: the pool is exhausted.
        found, _, snap = finding("pool_exhausted")
        assert found is not None, snap
        assert found["members"] == ["worker1"]
        assert f"all {THREADS} RPC threads of worker1 are busy (running park)" in found["message"]
        assert "@rpc.functions.async_execution" in found["message"] and "--threads" in found["message"]
        # %rpc_stacks shows the same, folded.
        shell.run_line_magic("rpc_stacks", "worker1")
    finally:
        cluster.run("gate.set()", "worker1")
        cluster.serve_on_torch_threads(False, "worker1")
    cell.join()
    assert cell.error is None and cell.value == [3] * (THREADS + 1)


def test_a_stuck_rpc_on_cell(cluster):
    code = ("import threading\n"
            "import torch.distributed.rpc as rpc\n"
            "ev = threading.Event()\n"
            "def g():\n"
            "    ev.wait(6)\n"
            "rpc.rpc_sync('worker1', g)\n")
    # The cell runs here (a kernel client belongs to the thread that made it); the
    # looking happens beside it.
    box = {}
    looking = threading.Thread(target=lambda: box.update(zip(("found", "took", "snap"), finding("blocked"))),
                               daemon=True)
    looking.start()
    cluster.run(code, "worker1")
    looking.join(10)
    assert box["found"] is not None, box["snap"]
    assert box["took"] < 3.0
    message = box["found"]["message"]
    assert message.startswith(f"{cluster.driver_name} waits on the %%rpc_on cell on worker1: "
                              "worker1 runs the %%rpc_on cell (worker1 cell ")
    assert "which waits on its call to g on worker1, blocked at `ev.wait(6)` (worker1 cell " in message


def test_rpc_stacks_text(shell, capsys):
    shell.run_line_magic("rpc_stacks", "worker1 worker2")
    out = capsys.readouterr().out
    assert out.startswith("worker1 (pid ") and "\nworker2 (pid " in out
    assert "thread Control" in out and "nbrpc/torch/library frame" in out


def test_rpc_waits_text(shell, capsys):
    shell.run_line_magic("rpc_waits", "")
    assert capsys.readouterr().out == "nbrpc: no call is pending\n"
    run(shell, "def nap():\n    time.sleep(2.5)\n")
    cell = Cell(shell, "rpc.rpc_sync('worker2', nap)")
    try:
        time.sleep(1.0)
        shell.run_line_magic("rpc_waits", "")
        out = capsys.readouterr().out
    finally:
        cell.join()
    assert f"  {nbrpc.current().driver_name} -> worker2: nap running at cell " in out
    with pytest.raises(UsageError):
        shell.run_line_magic("rpc_waits", "--show sometimes")


def test_rpc_stacks_unknown_member_names_the_members(shell, cluster):
    with pytest.raises(UsageError, match=r"%rpc_stacks: no member named 'nosuchworker'.*"
                                         rf"the members are: {cluster.driver_name}, worker1, worker2"):
        shell.run_line_magic("rpc_stacks", "nosuchworker")


def test_a_frozen_member_is_reported_within_a_second(shell, cluster):
    worker2 = next(w for w in cluster.workers if w.name == "worker2")
    os.kill(worker2.pid, signal.SIGSTOP)
    try:
        assert wait_until(worker2.stopped, 5)  # the signal is delivered a moment later
        cell = Cell(shell, "rpc.rpc_sync('worker2', torch.add, args=(1, 1), timeout=20)")
        began = time.monotonic()
        stacks = nbrpc.stacks(["worker2"])
        assert time.monotonic() - began < 1.0
        assert stacks == {"worker2": {"state": "frozen", "pid": worker2.pid,
                                      "why": "stopped by a signal (SIGSTOP)"}}
        found, took, snap = finding("dead_member")
        assert found is not None, snap
        assert found["message"].startswith(f"{cluster.driver_name} waits on add on worker2 (cell ")
        assert "), but worker2 is frozen (stopped by a signal (SIGSTOP)): it answers nothing" in found["message"]
        assert [m["state"] for m in snap["members"] if m["name"] == "worker2"] == ["frozen"]
    finally:
        os.kill(worker2.pid, signal.SIGCONT)
    cell.join()
    assert cell.error is None and int(cell.value) == 2


def test_a_member_holding_the_gil_is_reported_frozen_within_a_second(shell, cluster):
    # ctypes.PyDLL keeps the GIL through the C call: worker1's probe thread cannot run.
    run(shell, "def hold_gil():\n"
               "    import ctypes\n"
               "    ctypes.PyDLL(None).sleep(5)\n"
               "    return 5\n")
    cell = Cell(shell, "rpc.rpc_sync('worker1', hold_gil, timeout=30)")
    try:
        time.sleep(1.2)  # the call reaches worker1 and has held the GIL for over STUCK
        began = time.monotonic()
        snap = nbrpc.waits()
        took = time.monotonic() - began
        assert took < 1.0, took
        worker1 = next(m for m in snap["members"] if m["name"] == "worker1")
        assert worker1["state"] == "frozen", worker1
        assert [m["state"] for m in snap["members"] if m["name"] == "worker2"] == ["running"]
        found = next((f for f in snap["findings"] if f["kind"] == "dead_member"), None)
        assert found is not None, snap
        assert found["members"] == [cluster.driver_name, "worker1"]
        assert found["message"].startswith(f"{cluster.driver_name} waits on hold_gil on worker1 (cell ")
        assert "), but worker1 is frozen (no answer within " in found["message"]
        assert "a thread holds the GIL" in found["message"]
        # Never waited on: each look at it takes under a second, stacks too.
        began = time.monotonic()
        stacks = nbrpc.stacks()
        assert time.monotonic() - began < 1.0
        assert stacks["worker1"]["state"] == "frozen" and "threads" not in stacks["worker1"]
        assert stacks["worker2"]["state"] == "running" and stacks["worker2"]["threads"]
        assert cell.thread.is_alive()  # all of it while worker1 still holds the GIL
    finally:
        cell.join()
    assert cell.error is None and cell.value == 5
    # Once it lets go, worker1 answers again (its late answer to the probe it missed may
    # come a moment after the call's own reply), and the late answers to the probes it
    # missed are not taken for new ones.
    def answered():
        snap = nbrpc.waits()
        return snap if all(m["state"] == "running" for m in snap["members"]) else None

    snap = wait_until(answered, timeout=2.0) or nbrpc.waits()
    assert [m["state"] for m in snap["members"]] == ["running"] * 3
    assert snap["calls"] == [] and snap["findings"] == []


def test_the_cell_calls_a_member_frozen_only_once_it_stays_silent():
    # One missed probe may be a loaded machine; a member gone is sure at once.
    from nbrpc.kernel_ext.hangs import FROZEN_AFTER, HangWatch

    watch = HangWatch()
    frozen = {"kind": "dead_member", "members": ["master", "worker1"], "calls": ["m:1"], "message": "frozen"}
    gone = {"kind": "dead_member", "members": ["master", "worker2"], "calls": ["m:2"], "message": "gone"}
    blocked = {"kind": "blocked", "members": ["master", "worker1"], "calls": ["m:3"], "message": "blocked"}
    members = [{"name": "master", "state": "running"}, {"name": "worker1", "state": "frozen"},
               {"name": "worker2", "state": "gone"}]
    assert watch.settled([frozen, gone, blocked], members, now=100.0) == [gone, blocked]
    assert watch.settled([frozen, gone], members, now=100.0 + FROZEN_AFTER / 2) == [gone]
    assert watch.settled([frozen, gone], members, now=100.0 + FROZEN_AFTER) == [frozen, gone]
    # It answered in between: silent again, it waits again.
    members[1]["state"] = "running"
    assert watch.settled([], members, now=200.0) == []
    members[1]["state"] = "frozen"
    assert watch.settled([frozen], members, now=201.0) == []


def test_nbrpc_frozen_after_sets_how_long_a_member_may_stay_silent(monkeypatch):
    from nbrpc.kernel_ext.hangs import HangWatch

    monkeypatch.setenv("NBRPC_FROZEN_AFTER", "30")
    watch = HangWatch()
    frozen = {"kind": "dead_member", "members": ["master", "worker1"], "calls": ["m:1"], "message": "frozen"}
    members = [{"name": "master", "state": "running"}, {"name": "worker1", "state": "frozen"}]
    assert watch.frozen_after == 30.0
    assert watch.settled([frozen], members, now=100.0) == []
    assert watch.settled([frozen], members, now=129.0) == []
    assert watch.settled([frozen], members, now=130.0) == [frozen]
    for bad in ("soon", "0", "-5", "inf", "nan"):
        monkeypatch.setenv("NBRPC_FROZEN_AFTER", bad)
        with pytest.raises(ValueError, match=rf"NBRPC_FROZEN_AFTER='{bad}' is not a positive number of seconds: "
                                             r"set it to .* or unset it for the default \(3 s\)"):
            HangWatch()


def test_a_call_that_only_runs_long_is_no_finding(shell):
    run(shell, "def train_step():\n"
               "    end = time.monotonic() + 3\n"
               "    while time.monotonic() < end:\n"
               "        sum(range(1000))\n"
               "    return 4\n")
    cell = Cell(shell, "rpc.rpc_sync('worker1', train_step)")
    try:
        time.sleep(1.5)
        snap = nbrpc.waits()
        assert [c["function"] for c in snap["calls"]] == ["train_step"]
        assert snap["calls"][0]["state"] == "running"
        assert snap["findings"] == []
        assert nbrpc.current().queries.explain(snap["calls"][0]["id"]).startswith(
            "worker1 runs train_step (cell ")
    finally:
        cell.join()
    assert cell.value == 4



def test_calls_to_members_that_left_are_forgotten():
    """A call still in flight when its cluster shut down is no pending call of the next
    cluster, whose workers may have the same names."""
    from nbrpc.recording.pending import Pending

    table = Pending()
    table.calling("worker2", time.sleep, "a", "rpc_async")
    table.calling("worker3", time.sleep, "b", "rpc_async")
    table.forget_calls_to(["worker1", "worker2"])
    assert list(table.outgoing) == ["b"]


def test_a_remote_is_in_flight_until_its_owner_confirms_the_rref():
    """No callback per ``remote``: a call whose creation future is done, or whose RRef is
    gone, is dropped when the table is read, and the oldest such calls when the next
    ``remote`` is about to be sent."""
    from nbrpc.recording.pending import ID, Pending

    class Made:  # a stand-in RRef: the table keeps a weak reference and asks its future
        def __init__(self):
            self.future = torch.futures.Future()

        def _get_future(self):
            return self.future

    table = Pending()
    rrefs = [Made() for _ in range(4)]
    table.remote_made(table.remote_sending("worker1", time.sleep, "a", None), rrefs[0])
    table.remote_made(table.remote_sending("worker2", time.sleep, "b", None), rrefs[1])
    assert [e[ID] for e in table.in_flight()] == ["a", "b"] and _fetch_waits_on(table, rrefs[0]) == "a"
    rrefs[1].future.set_result(None)
    assert [e[ID] for e in table.in_flight()] == ["a"] and _fetch_waits_on(table, rrefs[1]) is None
    rrefs[0].future.set_result(None)
    key = table.remote_sending("worker1", time.sleep, "c", None)  # drops "a" before "c" leaves
    assert list(table.outgoing) == ["c"] and not table.remotes
    table.remote_made(key, rrefs[2])
    assert list(table.remotes) == ["c"] and table.rrefs == {id(rrefs[2]): "c"}
    table.remote_made(table.remote_sending("worker2", time.sleep, "d", None), rrefs[3])
    del rrefs[2]  # its RRef dropped: nothing can wait on "c" any more
    assert [e[ID] for e in table.in_flight()] == ["d"]


def _fetch_waits_on(table, rref) -> str | None:
    """The key of the remote a fetch of ``rref`` waits on (the fetch answered at once)."""
    key, on = table.fetching("worker1", rref)
    table.answered(key)
    return on


def test_a_fetched_remote_leaves_the_table_with_its_to_here():
    """Its value arrived: its function ran, whatever its creation future says yet."""
    from nbrpc.recording.pending import Pending

    class Made:
        def _get_future(self):
            return torch.futures.Future()  # never done

    table, rref = Pending(), Made()
    table.remote_made(table.remote_sending("worker1", time.sleep, "a", None), rref)
    fetch, on = table.fetching("worker1", rref)
    assert on == "a" and set(table.outgoing) == {"a", fetch}
    table.answered(fetch)
    table.fetched("a")
    assert not table.outgoing and not table.remotes and not table.rrefs
    table.fetched("a")  # twice (an interrupted fetch's helper): nothing left to drop


def test_a_call_answered_before_its_caller_returns_reads_its_site_when_asked():
    from nbrpc.recording.pending import Pending

    table = Pending()
    # Asked while this frame is on the calling line, as a caller waiting in its call is.
    line, key, report = sys._getframe().f_lineno, table.calling("worker1", time.sleep, None, "rpc_sync"), table.report()
    assert type(table.outgoing[key][3]) is types.FrameType  # kept, not formatted
    assert report["outgoing"][0]["site"] == [__file__, line]
    table.answered(key)
    assert table.report()["outgoing"] == []


def test_each_form_of_call_names_its_line_of_the_cell(shell):
    """rpc_sync's and to_here's sites are read from their caller's frame when asked;
    rpc_async's and remote's are found as they are made (they outlive their frame)."""
    run(shell, "def in_async():\n    time.sleep(6)\n"
               "def in_remote():\n    time.sleep(5)\n    return 5\n"
               "def in_sync():\n    time.sleep(2)\n")
    cell = Cell(shell, "fut = rpc.rpc_async('worker1', in_async)\n"
                       "made = rpc.remote('worker2', in_remote)\n"
                       "rpc.rpc_sync('worker2', in_sync)\n"
                       "made.to_here()\n"
                       "fut.wait()")
    seen = {}

    def every_site() -> bool:
        for call in nbrpc.waits()["calls"]:
            if call["caller"] == nbrpc.current().driver_name:
                seen[call["function"]] = call["site"]
        return len(seen) == 4

    assert wait_until(every_site, 12, interval=0.2), seen
    cell.join()
    assert cell.error is None
    lines = {function: site.rsplit(", ", 1) for function, site in seen.items()}
    assert all(cell_name.startswith("cell ") for cell_name, _ in lines.values()), seen
    assert {function: line for function, (_, line) in lines.items()} == {
        "in_async": "line 1", "in_remote": "line 2", "in_sync": "line 3", "to_here": "line 4"}
    assert wait_until(lambda: not nbrpc.waits()["calls"], 5, interval=0.2)


def test_a_forked_child_has_its_own_call_ids_and_no_calls_of_its_parent():
    from nbrpc.recording.pending import PENDING

    key = PENDING.calling("worker1", time.sleep, None, "rpc_sync")
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            calls = len(PENDING.outgoing)
            os.write(w, f"{PENDING.calling('worker1', time.sleep, None, 'rpc_sync')} {calls}".encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child_id, child_calls = os.read(r, 200).decode().split()
        assert child_id.startswith(f"{pid}-n") and child_calls == "0"
        assert key.startswith(f"{os.getpid()}-n") and key in PENDING.outgoing
    finally:
        PENDING.answered(key)
        os.close(r)
        os.close(w)
