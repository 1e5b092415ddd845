"""Hangs named while they happen, round two: a future nobody completes, an RRef's method
called through its proxy, and messages torch serves itself (an RRef's fetch, a
backward's gradients) queued behind a member's busy RPC threads.

Staged as in ``test_waits.py``: real worker kernels (worker1, worker2, four RPC threads
each), the waiting cell in a thread of this process, run through IPython's shell so that
its frames are cells, while the test asks the cluster what it waits on.
"""

from __future__ import annotations

import itertools
import time

import pytest
from conftest import Cell, as_main, finding, run, wait_gone, wait_until

import nbrpc
from nbrpc._compat import torch_compat

THREADS = 4
GATES = itertools.count()


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
        run(ip, "import threading, time\nimport torch\nimport torch.distributed.rpc as rpc\n"
                "import torch.distributed.autograd as dist_autograd")
        yield ip


def settled():
    return wait_until(lambda: not nbrpc.waits()["calls"], 15, interval=0.5)


def test_a_future_nobody_completes(shell, cluster):
    run(shell, "@rpc.functions.async_execution\n"
               "def never():\n"
               "    fut = torch.futures.Future()\n"
               "    return fut  # nothing sets it\n")
    cell = Cell(shell, "rpc.rpc_sync('worker2', never, timeout=5)")
    found, took, snap = finding("unset_future")
    assert found is not None, snap
    assert took < 3.0
    driver = cluster.driver_name
    message = found["message"]
    assert message.startswith(f"{driver} waits on never on worker2 (cell ")
    assert ", whose @async_execution function returned a future that nobody has set (made at cell " in message
    assert ", line 3). Its reply leaves only when that future completes" in message
    assert "Call set_result (or set_exception) on it" in message
    assert found["members"] == [driver, "worker2"]
    call = next(c for c in snap["calls"] if c["function"] == "never")
    assert call["state"] == "waiting" and call["future"]["made"].endswith(", line 3")
    cell.join()
    assert isinstance(cell.error, nbrpc.RpcTimeoutError)
    text = str(cell.error)
    assert text.startswith("rpc_sync('worker2', never) got no answer within 5 s (the future its "
                           "@async_execution function returned on 'worker2' was still not set")
    assert "When it stopped: " in text and "returned a future that nobody has set (made at cell " in text
    assert settled()  # the stop forgot it on worker2


def test_a_future_that_completes_later_is_no_finding(shell):
    run(shell, "@rpc.functions.async_execution\n"
               "def later():\n"
               "    fut = torch.futures.Future()\n"
               "    threading.Timer(1.5, fut.set_result, args=(9,)).start()\n"
               "    return fut\n")
    assert run(shell, "rpc.rpc_sync('worker1', later)") == 9
    assert nbrpc.waits()["calls"] == []


def test_an_rref_method_is_named_by_its_class_and_method(shell, cluster):
    driver = cluster.driver_name
    run(shell, "held = threading.Lock()\n"
               "def from_driver():\n"
               "    with held:\n"
               "        return 2\n"
               "class Box:\n"
               "    def take(self):\n"
               f"        return rpc.rpc_sync({driver!r}, from_driver, timeout=6)\n"
               "    def nap(self):\n"
               "        time.sleep(2.5)\n"
               "        return 3\n"
               "box = rpc.remote('worker1', Box)\n")
    # rpc_async() and remote() of a proxy too, in the wait-for graph.
    naps = Cell(shell, "[box.rpc_async().nap().wait(), box.remote().nap().to_here()]")
    time.sleep(1.2)
    names = sorted(c["function"] for c in nbrpc.waits()["calls"])
    assert names[:1] == ["Box.nap"] and "_local_invoke" not in names, names
    naps.join()
    assert naps.value == [3, 3]
    cell = Cell(shell, "with held:\n"
                       "    box.rpc_sync(timeout=5).take()\n")
    found, took, snap = finding("waits_on_caller")
    assert found is not None, snap
    assert took < 3.0
    message = found["message"]
    assert message.startswith(f"{driver} waits on Box.take on worker1 (cell ")
    assert "worker1 runs Box.take (cell " in message
    assert f"which waits on its call to from_driver on {driver}, blocked at `with held:` (cell " in message
    assert "_local_invoke" not in str(snap)
    cell.join()
    assert isinstance(cell.error, nbrpc.RpcTimeoutError)
    text = str(cell.error)
    assert text.startswith("rpc_sync('worker1', Box.take) got no answer within 5 s")
    assert "When it stopped: worker1 runs Box.take (cell " in text
    assert "_local_invoke" not in text
    assert settled()


class Parking:
    """Every one of worker2's four RPC threads parked on an event (``park``), nbrpc's
    hand-off off there, as torch serves calls; ``release`` lets them go."""

    def __init__(self, shell, cluster):
        self.shell, self.cluster = shell, cluster
        # A new name each time: worker2 keeps the event it was sent first (now set) by name.
        self.gate = f"gate{next(GATES)}"
        cluster.serve_on_torch_threads(True, "worker2")
        run(shell, f"{self.gate} = threading.Event()\n"
                   "def park():\n"
                   f"    {self.gate}.wait(20)\n"
                   "    return 3\n"
                   "def make():\n"
                   "    return torch.ones(2)\n")

    def park(self) -> None:
        Cell(self.shell, f"parked = [rpc.rpc_async('worker2', park, timeout=30) for _ in range({THREADS})]").join()
        assert wait_until(lambda: sum(1 for c in nbrpc.waits()["calls"] if c.get("blocked_at")) == THREADS,
                          10, interval=0.2)

    def release(self) -> None:
        self.cluster.run(f"{self.gate}.set()", "worker2")


@pytest.fixture
def busy_worker2(shell, cluster):
    parking = Parking(shell, cluster)
    yield parking
    parking.release()
    cluster.serve_on_torch_threads(False, "worker2")
    run(shell, "[f.wait() for f in parked]")
    assert settled()


def test_to_here_behind_a_members_busy_threads(shell, cluster, busy_worker2):
    run(shell, "made = rpc.remote('worker2', make)\nmade.to_here()")  # its value is there
    busy_worker2.park()
    cell = Cell(shell, "made.to_here(timeout=4)")
    found, took, snap = finding("pool_exhausted")
    assert found is not None, snap
    assert took < 3.0
    assert found["message"].startswith(f"all {THREADS} RPC threads of worker2 are busy (running park) and "
                                       "1 call to worker2 (to_here) waits behind them")
    fetch = next(c for c in snap["calls"] if c["function"] == "to_here")
    assert fetch["state"] == "queued" and fetch["id"] in found["calls"]
    cell.join()
    assert isinstance(cell.error, nbrpc.RpcTimeoutError)
    assert "When it stopped: " in str(cell.error)
    assert "to_here on worker2, queued: all 4 of worker2's RPC threads are busy" in str(cell.error)


def test_a_backwards_gradients_behind_a_members_busy_threads(shell, cluster, busy_worker2):
    run(shell, "context = dist_autograd.context()\n"
               "context_id = context.__enter__()\n"
               "x = torch.ones(2, requires_grad=True)\n"
               "y = rpc.rpc_sync('worker2', torch.mul, args=(x, 2))\n")  # the forward reached worker2
    torch_compat.set_rpc_timeout(5)  # the gradients' messages wait as long as an RPC
    try:
        busy_worker2.park()
        cell = Cell(shell, "dist_autograd.backward(context_id, [y.sum()])")
        found, took, snap = finding("pool_exhausted")
        assert found is not None, snap
        assert took < 3.0
        assert found["message"].startswith(f"all {THREADS} RPC threads of worker2 are busy (running park) "
                                           "and 1 call to worker2 (dist_autograd.backward) waits behind them")
        gradients = next(c for c in snap["calls"] if c["function"] == "dist_autograd.backward")
        assert gradients["state"] == "queued" and gradients["callee"] == "worker2"
        cell.join()
        assert isinstance(cell.error, nbrpc.RpcTimeoutError)
        text = str(cell.error)
        assert text.startswith("dist_autograd.backward(") and " got no answer within 5 s for its gradients" in text
        assert ("When it stopped: master waits on dist_autograd.backward on worker2, queued: all 4 of "
                "worker2's RPC threads are busy") in text
    finally:
        torch_compat.set_rpc_timeout(30)
        run(shell, "context.__exit__(None, None, None)")


def test_stacks_name_torchs_threads_by_what_they_serve(shell, busy_worker2, capsys):
    busy_worker2.park()
    threads = nbrpc.stacks(["worker2"])["worker2"]["threads"]
    serving = [t for t in threads if t["serving"] == "park"]
    assert sorted(t["name"] for t in serving) == [f"torch RPC thread {i}" for i in range(1, THREADS + 1)]
    assert all(t["torch"] for t in serving)
    assert any(t["name"] == "Control" for t in threads)  # a Python thread keeps its own name
    shell.run_line_magic("rpc_stacks", "worker2")
    out = capsys.readouterr().out
    assert "\n  torch RPC thread 1, serving park\n" in out and "\n  thread Control\n" in out
    assert "thread thread" not in out


def test_a_fetch_of_a_value_made_long_ago_waits_on_no_remote():
    """``to_here`` names the ``remote`` that makes its value; once that is over (and gone
    from the caller's table), the fetch waits on it no more: behind busy threads, it is
    queued."""
    from nbrpc.diagnostics import waits

    now = 1000.0
    served = [{"id": f"9-{i}", "function": "park", "thread": i, "since": now - 5} for i in range(THREADS)]
    members = [
        {"name": "master", "state": "running", "pool": THREADS, "report": {
            "pid": 9, "main_thread": 1, "served": [], "awaited": [], "threads": [], "inline": 0,
            "outgoing": [{"id": "9-n1", "callee": "worker2", "function": "to_here", "site": None,
                          "thread": 1, "since": now - 2, "kind": "to_here", "on": "9-0-long-over"}]}},
        {"name": "worker2", "state": "running", "pool": THREADS, "report": {
            "pid": 8, "main_thread": 1, "served": served, "awaited": [], "threads": [], "inline": THREADS,
            "outgoing": []}},
    ]
    snap = waits.snapshot(members, now=now)
    fetch = next(c for c in snap["calls"] if c["function"] == "to_here")
    assert fetch["state"] == "queued" and fetch["waits_on"] == []
    assert [f["kind"] for f in snap["findings"]] == ["pool_exhausted"]
    assert "1 call to worker2 (to_here) waits behind them" in snap["findings"][0]["message"]
