"""``nbrpc.waits()`` and ``nbrpc.stacks()`` reach a worker that joined with
``nbrpc worker --join`` (the path of ``--attach``, ``--hosts`` and Slurm): its kernel's
control port is on the address that reached the driver, here loopback over TCP.

The driver is a script of its own (``drivers``), the worker a process it starts with
the printed command, as a person on another machine would.
"""

from __future__ import annotations

DRIVER = """
import json, os, subprocess, sys, threading, time
import nbrpc
from nbrpc._util import unused_loopback_port
import torch.distributed.rpc as rpc

gate = threading.Event()

def park():
    gate.wait(20)
    return 7

def say(**record):
    print(json.dumps(record), flush=True)

# A free port below the ones handed to sockets bound to port 0 (one picked there was taken
# by another process's socket before the start): the command is known before the start.
port = unused_loopback_port()
cluster = nbrpc.Cluster(attach=1, bind="127.0.0.1", port=port, threads=2, progress=None)
token = cluster.join_command.split()[5]
worker = []

def join():
    time.sleep(1.0)  # the driver listens by then; the worker retries nothing
    worker.append(subprocess.Popen([sys.executable, "-m", "nbrpc.cli", "worker", "--join",
                                    f"127.0.0.1:{port}", "--token", token],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    say(worker=worker[0].pid)

threading.Thread(target=join, daemon=True).start()
cluster.start()
# nbrpc hands calls to threads of its own once torch's run short (calls.serving), so that
# blocking functions cannot exhaust torch's pool: staged here with that off.
cluster.serve_on_torch_threads(True, "worker1")
futs = [rpc.rpc_async("worker1", park) for _ in range(3)]
deadline = time.monotonic() + 15
pool = None
while time.monotonic() < deadline and pool is None:
    snap = nbrpc.waits()
    pool = next((f for f in snap["findings"] if f["kind"] == "pool_exhausted"), None)
    time.sleep(0.3)
began = time.monotonic()
stacks = nbrpc.stacks(["worker1"])
took = time.monotonic() - began
serving = [t for t in stacks["worker1"]["threads"] if t["serving"] == "park"]
say(pool=pool, stacks_took=took, serving=len(serving),
    waiting=[t["frames"][-1]["function"] for t in serving],
    blocked=[c.get("blocked_at", {}).get("code") for c in snap["calls"] if c.get("blocked_at")])
cluster.run("import __main__; __main__.gate.set()", "worker1")
say(values=[f.wait() for f in futs])
cluster.shutdown()
say(worker_exit=worker[0].wait(20))
"""


def test_an_attached_worker_answers_while_every_rpc_thread_is_blocked(drivers, pids):
    driver = drivers(DRIVER)
    pids.add(driver.expect("worker", 60)["worker"])
    record = driver.expect("pool", 90)
    assert record["pool"] is not None, record
    assert record["pool"]["members"] == ["worker1"]
    assert "all 2 RPC threads of worker1 are busy (running park)" in record["pool"]["message"]
    assert record["stacks_took"] < 1.0
    assert record["serving"] == 2 and record["waiting"] == ["wait", "wait"]
    assert record["blocked"] == ["gate.wait(20)", "gate.wait(20)"]
    assert driver.expect("values", 30)["values"] == [7, 7, 7]
    assert driver.expect("worker_exit", 40)["worker_exit"] is not None
    assert driver.proc.wait(30) == 0

