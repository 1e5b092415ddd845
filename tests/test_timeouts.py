"""Every timeout at its time: each form of a call that times out raises as soon as it
would under raw torch (within ``TOLERANCE``), with torch's class and words; stopping
the call on its worker goes on after the error, and the worker's next calls answer right.

The same forms (``timeout_forms.FORMS``) run in three plain processes under raw torch
and in a cluster; the times are compared in one test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import timeout_forms
import torch.distributed.rpc as rpc
from conftest import free_port

import nbrpc

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
# How much later than raw torch's a timeout's error may come (seconds).
TOLERANCE = 0.15


@pytest.fixture(scope="module")
def cluster():
    """worker1 and worker2, with this folder on their path (``timeout_forms`` goes by name)."""
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    c = nbrpc.start(2, progress=None, timeout=30, env={"PYTHONPATH": path})
    yield c
    c.shutdown()


def raw_torch_facts() -> dict:
    """``timeout_forms.measure()`` in a plain three-process torch RPC group."""
    done = subprocess.run([sys.executable, str(TESTS / "timeout_forms.py"), str(free_port())],
                          capture_output=True, text=True, timeout=240, cwd=TESTS)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_form_times_out_when_raw_torch_does(cluster):
    raw = raw_torch_facts()
    ours = timeout_forms.measure()
    assert set(ours) == set(raw) == set(timeout_forms.FORMS)
    for form, mine in ours.items():
        theirs = raw[form]
        assert theirs["seconds"] < timeout_forms.TIMEOUT + 0.1, (form, theirs)
        assert mine["seconds"] <= theirs["seconds"] + TOLERANCE, (form, mine["seconds"], theirs["seconds"])
        assert mine["seconds"] >= timeout_forms.TIMEOUT - 0.01, (form, mine)
        # torch's class and words, and nbrpc's explanation
        assert mine["runtime_error"] and theirs["runtime_error"], (form, mine, theirs)
        assert "RPC ran for more than set timeout" in mine["text"], (form, mine["text"])
        assert f"got no answer within {timeout_forms.TIMEOUT:g} s" in mine["text"], (form, mine["text"])
        assert mine["next_call"] and theirs["next_call"], form


def test_a_timeout_names_what_became_of_the_call(cluster):
    """The stop's answer is in the error when it comes in time: a Python loop is stopped
    at once; one long C call is asked to stop and ends when the call returns."""
    with pytest.raises(nbrpc.RpcTimeoutError) as info:
        rpc.rpc_sync("worker1", timeout_forms.spin, args=(timeout_forms.SLEEP,), timeout=timeout_forms.TIMEOUT)
    assert "(nbrpc stopped it on 'worker1')" in str(info.value), str(info.value)
    began = time.monotonic()
    with pytest.raises(nbrpc.RpcTimeoutError) as info:
        rpc.rpc_sync("worker1", timeout_forms.sleep_in_c, args=(timeout_forms.SLEEP,),
                     timeout=timeout_forms.TIMEOUT)
    assert time.monotonic() - began < timeout_forms.TIMEOUT + TOLERANCE
    text = str(info.value)
    assert ("'worker1' was asked to stop it but it still runs there" in text
            or "nbrpc asked 'worker1' to stop it" in text), text


def test_the_stop_after_a_timeout_leaves_every_thread_of_the_worker_right(cluster):
    """Calls that timed out in long C calls end on their worker after their errors were
    raised; the stop that lands as each returns must not hit a later call on that thread."""
    for _ in range(4):
        with pytest.raises(nbrpc.RpcTimeoutError):
            rpc.rpc_sync("worker1", timeout_forms.sleep_in_c, args=(1.0,), timeout=timeout_forms.TIMEOUT)
    time.sleep(1.2)  # every sleeping call has returned and met its stop
    futs = [rpc.rpc_async("worker1", timeout_forms.sleep_in_c, args=(0.01 * i,)) for i in range(40)]
    assert [f.wait() for f in futs] == [0.01 * i for i in range(40)]
    assert [rpc.rpc_sync("worker1", timeout_forms.echo, args=(i,)) for i in range(40)] == list(range(40))


def test_a_call_that_had_not_begun_when_its_timeout_fired_still_runs_as_under_torch(cluster):
    """torch runs a call whose caller gave up on it; nbrpc's stop after a timeout stops only
    a running one: a call still being unpickled on its worker when the timeout fired runs
    there (torch's ``_all_gather`` waits forever for a follower's call otherwise), and the
    error says it may."""
    slow = timeout_forms.SlowToUnpickle(0.6)
    began = time.monotonic()
    with pytest.raises(RuntimeError, match="RPC ran for more than set timeout") as raised:
        rpc.rpc_sync("worker1", timeout_forms.note, args=("late", slow), timeout=0.2)
    assert time.monotonic() - began < 0.2 + TOLERANCE + 0.1
    assert "it runs when it begins, as torch runs a call whose caller gave up on it" in str(raised.value)
    assert _times_noted("late") == 1
    # rpc_async's timeout: the same
    fut = rpc.rpc_async("worker1", timeout_forms.note, args=("late async", slow), timeout=0.2)
    with pytest.raises(RuntimeError, match="RPC ran for more than set timeout"):
        fut.wait()
    assert _times_noted("late async") == 1


def _times_noted(text: str) -> int:
    """How often worker1 noted ``text``, once it has (10 s at most)."""
    deadline = time.monotonic() + 10
    while text not in rpc.rpc_sync("worker1", timeout_forms.noted) and time.monotonic() < deadline:
        time.sleep(0.05)
    return rpc.rpc_sync("worker1", timeout_forms.noted).count(text)


def test_an_interrupt_still_cancels_a_call_that_has_not_begun(cluster):
    """The stop button (Ctrl-C: SIGINT here) while a call is still being unpickled on its
    worker: the stop cancels it, it never runs, and the error says so."""
    slow = timeout_forms.SlowToUnpickle(0.6)
    press = threading.Timer(0.2, os.kill, args=(os.getpid(), signal.SIGINT))
    press.start()
    try:
        with pytest.raises(KeyboardInterrupt, match="it had ended, or will not begin"):
            rpc.rpc_sync("worker1", timeout_forms.note, args=("cancelled", slow))
    finally:
        press.join()
    time.sleep(1.0)  # past the unpickling
    assert "cancelled" not in rpc.rpc_sync("worker1", timeout_forms.noted)
