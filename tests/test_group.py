"""The driver's group: TensorPipe's transport, chosen per kernel and used by every member."""

from __future__ import annotations

import pytest

import nbrpc
from nbrpc.group import membership

SHM_DRIVER = """
import json, os
import psutil
import torch.distributed.rpc as rpc
import nbrpc

def polls(pid):
    # TensorPipe's shared-memory transport runs one busy-polling reactor thread per member
    names = []
    for thread in psutil.Process(pid).threads():
        try:
            names.append(psutil.Process(thread.id).name())
        except psutil.NoSuchProcess:  # a thread that ended meanwhile
            pass
    return "TP_SHM_reactor" in names

cluster = nbrpc.start(2, transport="shm", progress=None)
members = [os.getpid()] + [w.pid for w in cluster.workers]
print(json.dumps({"pids": [w.pid for w in cluster.workers], "shm": [polls(p) for p in members],
                  "answer": rpc.rpc_sync("worker1", sum, args=([1, 2],))}), flush=True)
cluster.shutdown()
try:
    nbrpc.start(1, transport="uv", progress=None)
    print(json.dumps({"other": "started"}), flush=True)
except nbrpc.ClusterRunningError as e:
    print(json.dumps({"other": str(e)}), flush=True)
kept = nbrpc.start(1, progress=None)  # no transport given: the kernel's
print(json.dumps({"kept": kept.transport, "shm": polls(kept.workers[0].pid)}), flush=True)
kept.shutdown()
"""


@pytest.mark.slow
def test_shm_reaches_every_member_and_a_later_cluster_keeps_it(drivers):
    driver = drivers(SHM_DRIVER)
    record = driver.expect("shm", 120)
    driver.pids.add(*record["pids"])
    assert record["shm"] == [True, True, True] and record["answer"] == 3
    refusal = driver.expect("other", 60)["other"]
    assert "joined RPC with the 'shm' transport" in refusal
    assert "--transport shm" in refusal and "restart the kernel" in refusal
    assert driver.expect("kept", 60) == {"kept": "shm", "shm": True}
    assert driver.proc.wait(timeout=30) == 0


def test_uv_is_the_default_and_no_member_polls(cluster):
    pids = [w.pid for w in cluster.workers]
    for pid in pids:
        with open(f"/proc/{pid}/environ", "rb") as f:
            assert b"NBRPC_TRANSPORT=uv" in f.read().split(b"\0")
    assert cluster.transport == membership.driver_transport() == "uv"


def test_bad_transport_names_the_choices():
    with pytest.raises(ValueError, match="transport must be one of 'uv', 'shm', got 'tcp'"):
        nbrpc.Cluster(1, transport="tcp")



FD_DRIVER = """
import json, resource
import nbrpc

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # a laptop's usual soft limit
cluster = nbrpc.start(1, progress=None)
print(json.dumps({"pids": [w.pid for w in cluster.workers], "hard": hard,
                  "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}), flush=True)
cluster.shutdown()
"""


@pytest.mark.slow
def test_the_driver_raises_its_descriptor_limit(drivers):
    # torch keeps two descriptors per departed worker for the kernel's life; 1024 would
    # run out after a few hundred clusters.
    driver = drivers(FD_DRIVER)
    record = driver.expect("soft", 120)
    driver.pids.add(*record["pids"])
    assert record["soft"] == min(65536, record["hard"])
    assert driver.proc.wait(timeout=30) == 0


TOKENS_DRIVER = """
import json
import torch.distributed as dist
import nbrpc
from nbrpc.group import membership

def tokens(names):
    driver = membership.GROUP.driver
    members = dist.PrefixStore(driver.prefix, driver.store)
    return [key for name in names for key in (f"Token_for_{name}_join", f"Token_for_{name}_leave")
            if members.check([key])]

names = ["worker1", "worker2", "worker3"]
cluster = nbrpc.start(3, progress=None)
joined = tokens(names)
cluster.shutdown()
after = tokens(names)
again = nbrpc.start(3, progress=None)
print(json.dumps({"joined": joined, "after": after, "again": len(again.workers)}), flush=True)
again.shutdown()
"""


@pytest.mark.slow
def test_a_cluster_leaves_no_join_token_that_would_make_the_next_joiners_spin(drivers):
    """torch's join lock waits for the holder's ``Token_for_NAME_join`` key to read Done;
    one left from an earlier cluster is found at once, and every joiner waiting on a new
    worker of that name spun on the store (16 workers: 3.4 s of the store thread's CPU)."""
    driver = drivers(TOKENS_DRIVER)
    record = driver.expect("joined", 120)
    assert sorted(record["joined"]) == ["Token_for_worker1_join", "Token_for_worker2_join",
                                        "Token_for_worker3_join"]
    assert record["after"] == [] and record["again"] == 3
    assert driver.proc.wait(timeout=60) == 0
