"""``torch_threads_only``: the public knob that gives back torch's own serving, so that a
lesson can show torch's thread-pool deadlock, and switching back ends it.

A real cluster of two workers with 4 RPC threads each, started with the option: every
member serves each call on the torch thread that took it, as torch does.
"""

from __future__ import annotations

import os
import time

import pytest
import torch.distributed.rpc as rpc
from conftest import wait_until

import nbrpc
from nbrpc.calls import serving


def _a(x: int) -> int:
    return rpc.rpc_sync("worker2", _b, args=(x,), timeout=6)


def _b(x: int) -> int:
    return rpc.rpc_sync("worker1", _h, args=(x,), timeout=4)


def _h(x: int) -> int:
    time.sleep(0.1)
    return x * 10


def _inline_limit():
    return serving.pool.inline_limit


@pytest.fixture(scope="module")
def cluster():
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    c = nbrpc.start(2, progress=None, threads=4, timeout=30, torch_threads_only=True, env={"PYTHONPATH": path})
    yield c
    c.shutdown()
    assert serving.pool.inline_limit is None  # the driver serves as nbrpc does again


def test_every_member_serves_on_torchs_threads(cluster):
    assert cluster.torch_threads_only and serving.pool.inline_limit == serving.TORCH_THREADS_ONLY
    assert [rpc.rpc_sync(w, _inline_limit) for w in ("worker1", "worker2")] == [serving.TORCH_THREADS_ONLY] * 2


@pytest.mark.slow
def test_torchs_pool_deadlock_is_named_and_switching_back_ends_it(cluster):
    """Four calls to ``_a`` (which waits on worker2, which calls back into worker1) take all
    four of worker1's threads: nothing is left to serve the calls back, as in a script. The
    wait-for graph names it, and the knob still reaches the workers (through their kernels)
    while no RPC thread is free. (Which calls torch's timeouts then free is torch's affair.)"""
    futures = [rpc.rpc_async("worker1", _a, args=(x,), timeout=20) for x in range(4)]
    findings = []
    wait_until(lambda: findings.extend(f["kind"] for f in nbrpc.waits()["findings"]) or findings, 10,
               interval=0.3)
    assert "pool_exhausted" in findings, findings
    failed = []
    for f in futures:
        try:
            f.wait()
        except Exception as e:  # the nested calls ran out of time: torch's deadlock, broken by timeouts
            failed.append(type(e).__name__)
    assert len(failed) == 4, failed
    # Every RPC thread of both workers is taken: told through their kernels instead.
    cluster.serve_on_torch_threads(False)
    cluster.run("import nbrpc.calls.serving as s\nassert s.pool.inline_limit is None", "all")
