"""Recovering without a restart: functions that block do not starve torch's RPC
threads (``calls.serving``), a call's timeout stops its function on the worker as the
stop button does, nested calls included, and the messages say only what happened.

A real cluster whose workers have 4 RPC threads each; the interrupt is a real SIGINT
to this process while the main thread waits.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from conftest import wait_until

import nbrpc
from nbrpc._compat import torch_compat

# Worker-side code: the workers import this module (it is on their path); each keeps
# its own ``ended`` and ``lock``.
ended: list = []
lock = threading.Lock()


def _spin(tag: str, seconds: float = 60.0) -> str:
    """A runaway function: a busy loop (a core at 100 %) that records how it ended."""
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    except KeyboardInterrupt:
        ended.append((tag, "interrupted"))
        raise
    ended.append((tag, "finished"))
    return tag


def _ended() -> list:
    return list(ended)


def _spin_on(to: str, tag: str) -> str:
    """A call that waits on a runaway call to ``to``."""
    return rpc.rpc_sync(to, _spin, args=(tag,))


def _inner() -> int:
    with lock:
        return 1


def _outer() -> int:
    """The nested-lock deadlock: holds ``lock`` while its call back into this member
    waits for it."""
    with lock:
        return rpc.rpc_sync("worker1", _inner)


def _lock_held() -> bool:
    return lock.locked()


def _a(x: int) -> int:
    return rpc.rpc_sync("worker2", _b, args=(x,), timeout=12)


def _b(x: int) -> int:
    return rpc.rpc_sync("worker1", _h, args=(x,), timeout=8)


def _h(x: int) -> int:
    time.sleep(0.2)
    return x * 10


def _sleep_in_c(seconds: float) -> str:
    time.sleep(seconds)  # one C call: an asynchronous exception waits for it
    return "slept"


runs: list = []


def _where(tag: str) -> str:
    """The thread this call runs on; each run is kept in ``runs``."""
    runs.append(tag)
    return threading.current_thread().name


def _runs() -> list:
    return list(runs)


def _set_inline_limit(limit: int | None) -> None:
    from nbrpc.calls import serving

    serving.pool.inline_limit = limit


def _context_here() -> tuple[int, int]:
    """The distributed autograd context this call runs in, as torch and nbrpc see it."""
    return dist_autograd._current_context()._context_id(), torch_compat.thread_context_id()


def _times_on(to: str, t: torch.Tensor) -> torch.Tensor:
    return rpc.rpc_sync(to, torch.mul, args=(t, 3.0)) * 2


@pytest.fixture(scope="module")
def cluster():
    """worker1 and worker2 with 4 RPC threads each, with this folder on their path."""
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    c = nbrpc.start(2, progress=None, threads=4, timeout=30, env={"PYTHONPATH": path})
    yield c
    c.shutdown()


def _wait_for_ended(worker: str, entry: tuple, timeout: float = 10.0) -> list:
    found = []

    def has_entry() -> bool:
        found[:] = [tuple(x) for x in rpc.rpc_sync(worker, _ended)]
        return entry in found

    wait_until(has_entry, timeout, interval=0.1)
    return found


def _answers_within(seconds: float) -> None:
    began = time.monotonic()
    assert rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
    assert rpc.rpc_sync("worker2", pow, args=(2, 5)) == 32
    assert rpc.rpc_sync("worker1", _h, args=(4,)) == 40
    assert time.monotonic() - began < seconds


# -- the pool deadlock ----------------------------------------------------------------


def test_more_blocking_calls_than_rpc_threads_complete(cluster):
    """The classic pool deadlock (issue 32): with 4 RPC threads, four calls to a, which
    waits on b on worker2, which calls back into worker1. In a script every RPC thread
    of worker1 waits and the group wedges for good; here each function runs on a
    serving thread and torch's threads stay free to take the calls back."""
    began = time.monotonic()
    futures = [rpc.rpc_async("worker1", _a, args=(x,)) for x in range(4)]
    assert [f.wait() for f in futures] == [0, 10, 20, 30]
    assert time.monotonic() - began < 8  # no timeout was waited out
    # Twice the threads, then the same cluster answers at once.
    futures = [rpc.rpc_async("worker1", _a, args=(x,)) for x in range(8)]
    assert [f.wait() for f in futures] == [x * 10 for x in range(8)]
    _answers_within(3)


def test_a_waited_call_runs_on_torch_thread_until_the_limit_then_is_served(cluster):
    """``rpc_sync``'s function runs on torch's thread while the member's torch threads may
    run more calls; past that limit it is handed to a serving thread: its value comes
    back, and it ran once."""
    assert not rpc.rpc_sync("worker1", _where, args=("direct",)).startswith("nbrpc-serve")
    rpc.rpc_sync("worker1", _set_inline_limit, args=(0,))
    try:
        assert rpc.rpc_sync("worker1", _where, args=("refused",)).startswith("nbrpc-serve")
    finally:
        rpc.rpc_sync("worker1", _set_inline_limit, args=(None,))
    assert rpc.rpc_sync("worker1", _runs)[-2:] == ["direct", "refused"]
    assert not rpc.rpc_sync("worker1", _where, args=("direct again",)).startswith("nbrpc-serve")


def test_a_call_runs_in_its_callers_autograd_context(cluster):
    with dist_autograd.context() as context_id:
        here = rpc.rpc_sync("worker1", _context_here_with, args=(torch.ones(1, requires_grad=True),))
        assert here == [context_id, context_id]
    # A nested call made there joins the context: the backward reaches worker2. (A
    # context of its own: torch's backward waits for every call a context sent to.)
    with dist_autograd.context() as context_id:
        t = torch.ones(2, requires_grad=True)
        loss = rpc.rpc_sync("worker1", _times_on, args=("worker2", t)).sum()
        dist_autograd.backward(context_id, [loss])
        assert dist_autograd.get_gradients(context_id)[t].tolist() == [6.0, 6.0]
    # Outside one, none.
    assert rpc.rpc_sync("worker1", torch_compat.thread_context_id) == -1


def _context_here_with(t: torch.Tensor) -> list:
    return list(_context_here())


# -- a timeout stops the function -------------------------------------------------------


def test_a_timeout_stops_the_runaway_function(cluster):
    with pytest.raises(nbrpc.RpcTimeoutError) as info:
        rpc.rpc_sync("worker1", _spin, args=("timed out",), timeout=1)
    assert str(info.value).startswith(
        "rpc_sync('worker1', _spin) got no answer within 1 s (nbrpc stopped it on 'worker1')")
    # Stopped when the caller gave up, not at the end of its 60 s.
    assert ("timed out", "interrupted") in _wait_for_ended("worker1", ("timed out", "interrupted"), 3)
    _answers_within(3)


def test_a_timeout_of_rpc_async_stops_the_function(cluster):
    fut = rpc.rpc_async("worker2", _spin, args=("async timed out",), timeout=1)
    _wait_for_ended("worker2", ("async timed out", "interrupted"), 6)
    with pytest.raises(nbrpc.RpcTimeoutError, match=r"within 1 s \(nbrpc stopped it on 'worker2'\)"):
        fut.wait()


def test_a_timeout_stops_nested_calls_too(cluster):
    with pytest.raises(nbrpc.RpcTimeoutError, match="nbrpc stopped it on 'worker1'"):
        rpc.rpc_sync("worker1", _spin_on, args=("worker2", "nested"), timeout=1.5)
    # worker1's call waited on worker2's runaway function: both ended.
    assert ("nested", "interrupted") in _wait_for_ended("worker2", ("nested", "interrupted"), 3)
    _answers_within(3)


# -- the stop button --------------------------------------------------------------------


def test_an_interrupted_nested_lock_deadlock_recovers_at_once(cluster, stop_button):
    """outer holds a lock while its call back into worker1 waits for it. The stop
    button stops both (outer first: its wait wakes, the lock is freed), and the
    message's claim is true: worker1 answers at once, not after a timeout."""
    stop_button(1.5)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        rpc.rpc_sync("worker1", _outer)
    message = str(info.value)
    assert message.startswith("rpc_sync('worker1', _outer) was interrupted, and stopped on 'worker1' too. ")
    # The diagnosis of the moment it stopped follows the claim (nbrpc.waits' bookkeeping).
    assert "worker1 runs _outer" in message and "blocked at `with lock:`" in message
    assert time.monotonic() - began < 6
    _answers_within(3)
    assert rpc.rpc_sync("worker1", _lock_held) is False


def test_a_stop_that_cannot_land_is_not_claimed(cluster, stop_button):
    """A function in one long C call cannot be stopped before the call returns: the
    message says it still runs, and the cluster still answers meanwhile."""
    stop_button(1.0)
    with pytest.raises(KeyboardInterrupt) as info:
        rpc.rpc_sync("worker2", _sleep_in_c, args=(8.0,))
    assert "stopped on" not in str(info.value)
    assert str(info.value).startswith(
        "rpc_sync('worker2', _sleep_in_c) was interrupted; 'worker2' was asked to stop it but it "
        "still runs there")
    _answers_within(3)
