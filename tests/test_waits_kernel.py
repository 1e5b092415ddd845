"""A stuck cell names its hang in its own output, by itself, in a real notebook kernel.

The kernel is a real ipykernel driven over the Jupyter protocol (as a notebook front
end does); it runs ``%rpc_init`` and starts its own worker kernel.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from conftest import LOCK_CELL, execute, streamed

pytestmark = pytest.mark.slow



LATE = "[worker1] (late: what a call wrote after the cell that made it had ended)"


def _until_idle(client, msg_id: str, timeout: float) -> list[tuple[float, dict]]:
    """Every IOPub message of request ``msg_id`` with the time it came, until idle."""
    deadline = time.monotonic() + timeout
    out = []
    while True:
        msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return out
        out.append((time.monotonic(), msg))


def test_the_stuck_cell_shows_the_finding_then_a_summary_and_the_error_says_it(kernel):
    km, kc = kernel
    _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 1 --timeout 6\n"
                           "import threading\nimport nbrpc\nimport torch.distributed.rpc as rpc", timeout=180)
    assert reply["status"] == "ok", reply
    try:
        msg_id = kc.execute(LOCK_CELL)
        messages = _until_idle(kc, msg_id, 60)
        began = next(t for t, m in messages if m["msg_type"] == "execute_input")
        shown = [(t, m) for t, m in messages if m["msg_type"] in ("display_data", "update_display_data")
                 and "nbrpc: stuck (blocked)" in m["content"]["data"].get("text/plain", "")]
        assert shown, [m["msg_type"] for _, m in messages]
        first_at, first = shown[0]
        assert first_at - began < 3.0, f"the finding showed {first_at - began:.1f} s after the cell began"
        text = first["content"]["data"]["text/plain"]
        assert "worker1 runs outer (cell " in text
        assert "which waits on its call to inner on worker1, blocked at `with lock:` (cell " in text
        assert "line 3)" in text  # `with lock:` is the cell's third line
        assert first["content"]["transient"].get("display_id")  # updated in place, not appended

        error = next(m["content"] for _, m in messages if m["msg_type"] == "error")
        assert error["ename"] == "RpcTimeoutError"
        assert "When it stopped: worker1 runs outer (cell " in error["evalue"]
        assert not [line for line in error["traceback"] if "nbrpc/calls/" in line or "distributed/rpc/" in line]
        assert ", line 7), which waits on its call to inner on worker1, blocked at `with lock:`" in error["evalue"]
        summary = streamed([m for _, m in messages])
        assert summary.startswith("nbrpc: this cell waited on a hang (blocked; ")

        # How outer ends on worker1 (inner's own timeout there, or nbrpc stopping outer
        # because its caller gave up) only passes on what the cell's error told: it is
        # written out nowhere, neither in the stuck cell nor late in the next one.
        time.sleep(2.0)
        next_messages, _ = execute(kc, "1 + 1")
        here, late = streamed([m for _, m in messages], "stderr"), streamed(next_messages, "stderr")
        assert "Traceback" not in here and late == "", (here, late)

        # A call that ends after its caller gave up: what it wrote shows marked late.
        _, reply = execute(kc, "def slow():\n"
                               "    try:\n"
                               "        for _ in range(25): time.sleep(0.1)\n"
                               "    finally:  # the timeout stops slow: its finally writes after the cell\n"
                               "        time.sleep(1.5)\n"
                               "        print('finished after all')\n"
                               "import time", timeout=30)
        gave_up, reply = execute(kc, "rpc.rpc_sync('worker1', slow, timeout=1)")
        assert reply["status"] == "error" and reply["ename"] == "RpcTimeoutError"
        time.sleep(3.0)
        following, _ = execute(kc, "2 + 2")
        late = streamed(following, "stderr") + streamed(following)
        assert late.startswith(LATE), late

        # A call that is only long shows nothing.
        long_messages, reply = execute(kc, "import time\n"
                                           "def step():\n"
                                           "    end = time.monotonic() + 3\n"
                                           "    while time.monotonic() < end: pass\n"
                                           "rpc.rpc_sync('worker1', step)")
        assert reply["status"] == "ok"
        assert not [m for m in long_messages if m["msg_type"] in ("display_data", "update_display_data")]
        assert "nbrpc:" not in streamed(long_messages)

        # Unless asked: then a cell that waits for a second shows its pending calls.
        _, reply = execute(kc, "%rpc_waits --show always")
        assert reply["status"] == "ok"
        shown_messages, reply = execute(kc, "rpc.rpc_sync('worker1', step)")
        assert reply["status"] == "ok"
        shown = [m["content"]["data"]["text/plain"] for m in shown_messages
                 if m["msg_type"] in ("display_data", "update_display_data")]
        assert shown and "master -> worker1: step running at cell " in shown[0]

        # A worker that dies while a call waits: the error says what it was doing.
        _, reply = execute(kc, "%rpc_waits --show findings")
        pid_messages, _ = execute(kc, "print(nbrpc.current().workers[0].pid)")
        pid = int(streamed(pid_messages))
        msg_id = kc.execute("gate = threading.Event()\n"
                            "def park():\n"
                            "    gate.wait(30)\n"
                            "rpc.rpc_sync('worker1', park)")
        time.sleep(2.5)
        os.kill(pid, signal.SIGKILL)
        died = _until_idle(kc, msg_id, 30)
        error = next(m["content"] for _, m in died if m["msg_type"] == "error")
        assert error["ename"] == "WorkerDiedError"
        assert "rpc_sync('worker1', park) failed: worker 'worker1'" in error["evalue"]
        assert "When it stopped: worker1 runs park (cell " in error["evalue"]
        assert "blocked at `gate.wait(30)` (cell " in error["evalue"]
    finally:
        execute(kc, "%rpc_shutdown", timeout=60)


CHAIN = """\
import threading
import torch.distributed.rpc as rpc
lock = threading.Lock()
def h():
    with lock:
        return 1
def g():
    return rpc.rpc_sync("worker1", h)
def f():
    with lock:
        return rpc.rpc_sync("worker2", g)
"""


def test_a_failing_chain_across_three_members_is_told_once(kernel):
    # master -> worker1 (f holds the lock) -> worker2 (g) -> worker1 (h needs the lock):
    # every call times out; the cell shows one error with the chain, no nbrpc frames,
    # and no worker's traceback, then or late.
    km, kc = kernel
    _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 2 --timeout 6", timeout=180)
    assert reply["status"] == "ok", reply
    try:
        _, reply = execute(kc, CHAIN)
        assert reply["status"] == "ok", reply
        msg_id = kc.execute("rpc.rpc_sync('worker1', f)")
        messages = _until_idle(kc, msg_id, 60)
        began = next(t for t, m in messages if m["msg_type"] == "execute_input")
        shown = [(t, m["content"]["data"]["text/plain"]) for t, m in messages
                 if m["msg_type"] in ("display_data", "update_display_data")]
        blocked = [(t, text) for t, text in shown if "nbrpc: stuck (blocked)" in text]
        assert blocked and blocked[0][0] - began < 3.0, shown
        chain = ("worker1 runs f (cell 2, line 11), which waits on its call to g on worker2 (cell 2, line 8), "
                 "which waits on its call to h on worker1, blocked at `with lock:` (cell 2, line 5)")
        assert chain in blocked[0][1]
        error = next(m["content"] for _, m in messages if m["msg_type"] == "error")
        assert error["ename"] == "RpcTimeoutError"
        assert error["evalue"].startswith("rpc_sync('worker1', f) got no answer within 6 s (")
        assert f"When it stopped: {chain}. Torch said: " in error["evalue"]
        # Consistent: f ran on worker1 until nbrpc went to stop it (or nbrpc stopped it).
        assert "it was not running on" not in error["evalue"]
        assert ("(it had ended on 'worker1' when nbrpc went to stop it, with RpcTimeoutError: "
                "rpc_sync('worker2', g) got no answer within 6 s" in error["evalue"]
                or "(nbrpc stopped it on 'worker1')" in error["evalue"]), error["evalue"]
        traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
        assert "Cell In[3], line 1" in traceback
        assert "nbrpc/calls/" not in traceback and "distributed/rpc/" not in traceback, traceback
        assert "The above exception was the direct cause" not in traceback
        time.sleep(3.0)  # every nested call has ended by now
        next_messages, _ = execute(kc, "1 + 1")
        here, late = streamed([m for _, m in messages], "stderr"), streamed(next_messages, "stderr")
        assert here == "" and late == "", (here, late)
    finally:
        execute(kc, "%rpc_shutdown", timeout=60)


POOL_CELL = """\
futs = [rpc.rpc_async("worker1", a, timeout=12) for _ in range(4)]
torch.futures.wait_all(futs)
"""


def test_the_pool_deadlock_across_two_workers_is_named_in_the_cell(kernel):
    # The classic: every RPC thread of worker1 runs a, which waits on b on worker2, which
    # waits on h on worker1, queued behind the a's. In a kernel of its own: torch may
    # leave the pair (and the driver's agent) wedged after it.
    km, kc = kernel
    _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 2 --threads 4 --timeout 30\n"
                           "import torch\nimport torch.distributed.rpc as rpc\n"
                           "def h():\n"
                           "    return 5\n"
                           "def b():\n"
                           "    return rpc.rpc_sync('worker1', h, timeout=8)\n"
                           "def a():\n"
                           "    return rpc.rpc_sync('worker2', b, timeout=10)\n"
                           # calls.serving prevents this deadlock: staged with its hand-off off
                           "import nbrpc\n"
                           "nbrpc.current().serve_on_torch_threads(True)\n",
                           timeout=180)
    assert reply["status"] == "ok", reply
    msg_id = kc.execute(POOL_CELL)
    messages = _until_idle(kc, msg_id, 60)
    began = next(t for t, m in messages if m["msg_type"] == "execute_input")
    shown = [(t, m["content"]["data"]["text/plain"]) for t, m in messages
             if m["msg_type"] in ("display_data", "update_display_data")]
    cycle = [(t, text) for t, text in shown if "nbrpc: stuck (cycle)" in text]
    assert cycle, shown
    assert cycle[0][0] - began < 3.0, f"the finding showed {cycle[0][0] - began:.1f} s after the cell began"
    text = cycle[0][1]
    assert "master waits on a on worker1 (cell " in text
    assert "worker1 runs a (cell " in text and "which waits on its call to b on worker2 (cell " in text
    assert "which waits on its call to h on worker1, queued: all 4 of worker1's RPC threads are busy" in text
    assert "@rpc.functions.async_execution" in text
    assert ("nbrpc: stuck (pool_exhausted): all 4 RPC threads of worker1 are busy (running a) and 4 calls "
            "to worker1 (h) wait behind them" in text)
    assert any(m["msg_type"] == "error" for _, m in messages)
    assert streamed([m for _, m in messages]).startswith("nbrpc: this cell waited on a hang (cycle, pool_exhausted; ")
