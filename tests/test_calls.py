"""``rpc_async`` futures, ``remote`` and ``to_here`` name the worker as ``rpc_sync``
does; Ctrl-C stops a waiting call, and stops ``rpc_sync``/``rpc_async`` calls on
their worker too, leaving the worker healthy.

The interrupt is a real SIGINT to this process while the main thread waits.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import wait_until

import nbrpc

# Worker-side code: the workers import this module (it is on their path), so
# ``_loop`` runs there and records in the worker how each run ended.
ended: list = []


def _loop(seconds: float, tag: str) -> str:
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.05)
    except KeyboardInterrupt:
        ended.append((tag, "interrupted"))
        raise
    ended.append((tag, "finished"))
    return tag


def _ended() -> list:
    return list(ended)


def _echo(value):
    return value


_per_thread = threading.local()


def _count_on_this_thread() -> tuple[int, int]:
    """(this RPC thread, how many calls it has run), kept in a thread-local."""
    _per_thread.calls = getattr(_per_thread, "calls", 0) + 1
    return threading.get_ident(), _per_thread.calls


@pytest.fixture(scope="module")
def cluster():
    """worker1 and worker2, with this folder on their path."""
    path = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    c = nbrpc.start(2, progress=None, timeout=30, env={"PYTHONPATH": path})
    yield c
    c.shutdown()


# -- torch's RPC threads --------------------------------------------------------------


def test_rpc_threads_keep_their_python_state_between_calls(cluster):
    """torch runs each call's Python on a new thread state; nbrpc keeps one per RPC
    thread (torch_compat.keep_thread_state), so thread-locals last as on any thread."""
    runs: dict[int, list[int]] = {}
    for _ in range(60):
        thread, calls = rpc.rpc_sync("worker2", _count_on_this_thread)
        runs.setdefault(thread, []).append(calls)
    # The first call on a thread keeps its state from then on: each thread counts up.
    assert all(counts == list(range(counts[0], counts[0] + len(counts))) for counts in runs.values())
    assert max(max(counts) for counts in runs.values()) > 2


# -- named failures -------------------------------------------------------------------


def test_timeouts_are_named(cluster):
    with pytest.raises(nbrpc.RpcTimeoutError, match=r"rpc_async\('worker1', sleep\) got no answer within 0.5 s"):
        rpc.rpc_async("worker1", time.sleep, args=(3,), timeout=0.5).wait()
    rref = rpc.remote("worker1", time.sleep, args=(3,))
    with pytest.raises(nbrpc.RpcTimeoutError, match=r"to_here\(\) of an RRef owned by 'worker1' got no answer"):
        rref.to_here(timeout=0.5)


def test_a_destination_is_named_by_its_worker_name_however_it_is_given(cluster):
    from nbrpc.recording.functions import destination_name

    # A member's rank is its worker id: the order it joined in, not its name's number
    # (a process that ran clusters before counts on).
    info, rank1 = rpc.get_worker_info("worker2"), rpc.get_worker_info("worker1").id
    assert [destination_name(to) for to in ("worker1", info, info.id, rank1, 999)] == [
        "worker1", "worker2", "worker2", "worker1", "999"]
    with pytest.raises(nbrpc.RpcTimeoutError, match=r"rpc_async\('worker1', sleep\) got no answer within 0.5 s"):
        rpc.rpc_async(rank1, time.sleep, args=(1,), timeout=0.5).wait()


def test_unsendable_replies_are_named(cluster):
    with pytest.raises(nbrpc.SerializationError) as info:
        rpc.rpc_async("worker2", threading.Lock).wait()
    assert str(info.value).startswith("rpc_async('worker2', allocate_lock) ran on 'worker2' but its reply")
    assert "cannot send the result (lock) over RPC" in str(info.value)

    rref = rpc.remote("worker2", threading.Lock)  # the lock stays on worker2...
    with pytest.raises(nbrpc.SerializationError) as info:
        rref.to_here()  # ...and cannot travel
    assert "to_here() of an RRef owned by 'worker2' ran on 'worker2'" in str(info.value)
    assert "cannot send the result (lock)" in str(info.value)
    assert "frame #" not in str(info.value)


def _fail(text: str):
    raise ValueError(text)


def test_wait_all_raises_the_first_failure_at_once(cluster):
    """As with torch's futures: torch.futures.wait_all does not wait for a slow call once
    another failed, and the failure keeps its class (torch's test_wait_all_exit_early_*)."""
    slow = rpc.rpc_async("worker1", _loop, args=(10.0, "slow"))
    failing = rpc.rpc_async("worker2", _fail, args=("failed early",))
    began = time.monotonic()
    with pytest.raises(ValueError, match="failed early"):
        torch.futures.wait_all([slow, failing])
    assert time.monotonic() - began < 5, "wait_all waited for the slow call"
    done = torch.futures.collect_all([rpc.rpc_async("worker1", _loop, args=(0.0, "a")),
                                      rpc.rpc_async("worker2", _loop, args=(0.0, "b"))]).wait()
    assert [f.value() for f in done] == ["a", "b"]
    assert slow.wait() == "slow" and time.monotonic() - began >= 10


# -- the stop button --------------------------------------------------------------------


def test_interrupted_rpc_sync_stops_the_call_on_the_worker(cluster, stop_button):
    beside = rpc.rpc_async("worker1", _loop, args=(3, "beside"))
    stop_button(1.0)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt) as info:
        rpc.rpc_sync("worker1", _loop, args=(60, "stopped"))
    assert time.monotonic() - began < 30
    # It says what the call was doing on its worker when it was stopped.
    sleeping = _loop.__code__.co_firstlineno + 4  # its time.sleep(0.05)
    assert str(info.value) == ("rpc_sync('worker1', _loop) was interrupted, and stopped on 'worker1' too. "
                               f"When it stopped: worker1 runs _loop (test_calls.py, line {sleeping})")

    # The concurrent call runs on to its end; only the interrupted one stopped.
    assert beside.wait() == "beside"
    ended = _wait_for_ended(("stopped", "interrupted"))
    assert ("stopped", "interrupted") in ended and ("beside", "finished") in ended
    assert ("stopped", "finished") not in ended
    # The worker stays healthy: its RPC threads serve later calls.
    assert rpc.rpc_sync("worker1", _loop, args=(0.1, "later")) == "later"
    assert rpc.rpc_sync("worker1", pow, args=(2, 10)) == 1024


def test_interrupted_future_wait_stops_the_call_on_the_worker(cluster, stop_button):
    fut = rpc.rpc_async("worker1", _loop, args=(60, "async"))
    stop_button(1.0)
    with pytest.raises(KeyboardInterrupt, match=r"rpc_async\('worker1', _loop\) was interrupted, and stopped"):
        fut.wait()
    assert ("async", "interrupted") in _wait_for_ended(("async", "interrupted"))
    assert rpc.rpc_async("worker1", _loop, args=(0.1, "after")).wait() == "after"


def test_interrupted_to_here_stops_the_waiting(cluster, stop_button):
    rref = rpc.remote("worker1", _loop, args=(3, "remote"))
    stop_button(1.0)
    with pytest.raises(KeyboardInterrupt, match="only the waiting stopped"):
        rref.to_here()
    # while the interrupted fetch goes on, other fetches take another helper thread
    assert [rpc.remote("worker1", torch.add, args=(i, 1)).to_here() for i in range(3)] == [1, 2, 3]
    # remote's function is not stopped: it ends, and its value can be fetched.
    assert rref.to_here() == "remote"
    assert ("remote", "finished") in rpc.rpc_sync("worker1", _ended)
    from nbrpc.calls import fetch_threads
    assert len(fetch_threads.idle) <= 2  # helpers are taken again, not one made per fetch


def test_to_here_waits_itself_then_on_a_helper_in_a_kernel(cluster, monkeypatch):
    """In a kernel, a value that is there soon is fetched on the main thread; one that
    takes longer than DIRECT_FETCH is fetched again on a helper thread, whose wait the
    stop button can end, and arrives once; a short timeout of the caller's is kept."""
    from nbrpc.calls import fetch_threads, wrappers

    monkeypatch.setattr(wrappers, "_in_a_kernel", lambda: True)
    taken = []
    take = fetch_threads.take
    monkeypatch.setattr(fetch_threads, "take", lambda: taken.append(1) or take())
    assert rpc.remote("worker1", torch.add, args=(1, 1)).to_here() == 2
    assert taken == []
    began = time.monotonic()
    slow = wrappers.DIRECT_FETCH + 0.5
    assert rpc.remote("worker1", _loop, args=(slow, "slow fetch")).to_here() == "slow fetch"
    assert taken == [1] and slow <= time.monotonic() - began < slow + 5
    with pytest.raises(RuntimeError, match=r"got no answer within 0.5 s"):  # within DIRECT_FETCH: here
        rpc.remote("worker1", _loop, args=(slow, "timed out")).to_here(timeout=wrappers.DIRECT_FETCH)
    assert taken == [1]


def _slow_rref(seconds: float):
    """On worker1: an RRef of its own, after ``seconds``."""
    time.sleep(seconds)
    return rpc.RRef(torch.ones(2))


def _owned() -> int:
    return int(rpc._rref_context_get_debug_info()["num_owner_rrefs"])


def _settled_owned() -> int:
    """worker1's count of RRefs it owns, once the deletes of earlier tests' RRefs are in."""
    counts = [rpc.rpc_sync("worker1", _owned)]
    while len(counts) < 3 or len(set(counts[-3:])) > 1:
        time.sleep(0.3)
        counts.append(rpc.rpc_sync("worker1", _owned))
    return counts[-1]


def test_to_here_outside_a_kernel_fetches_once_so_no_fork_is_left(cluster, monkeypatch):
    """A script's ``to_here`` waits as torch's does, however long the value takes, on the
    main thread: sent twice, the first reply would be dropped unread and the RRef in it
    left forked on its owner for good (what made torch's ``test_nested_rref_stress`` hang
    in ``rpc.shutdown``)."""
    from nbrpc.calls import fetch_threads, wrappers

    taken = []
    take = fetch_threads.take
    monkeypatch.setattr(fetch_threads, "take", lambda: taken.append(1) or take())
    before = _settled_owned()
    outer = rpc.remote("worker1", _slow_rref, args=(wrappers.DIRECT_FETCH + 0.5,))
    inner = outer.to_here()
    assert torch.equal(inner.to_here(), torch.ones(2)) and taken == []
    del inner, outer
    assert wait_until(lambda: rpc.rpc_sync("worker1", _owned) == before, timeout=10)


def _wait_for_ended(entry: tuple, timeout: float = 10.0) -> list:
    """worker1's record of ended runs, once it has ``entry``."""
    ended = []

    def has_entry() -> bool:
        ended[:] = [tuple(x) for x in rpc.rpc_sync("worker1", _ended)]
        return entry in ended

    wait_until(has_entry, timeout, interval=0.1)
    return ended


def test_agent_devices_follow_torchs_rules_for_joins_and_leaves():
    import torch

    from nbrpc.calls import agent_devices

    cuda = [torch.device("cuda", i) for i in range(3)]
    devices = agent_devices.AgentDevices()
    devices.constructed(["cuda:1", "cuda:0", "cuda:1"])  # a static group's agent
    assert devices.current() == [cuda[1], cuda[0]]
    devices.updated([cuda[2], cuda[0]], True)  # a join adds what the agent lacks
    assert devices.current() == [cuda[1], cuda[0], cuda[2]]
    devices.updated([cuda[0]], False)  # a leave keeps only what it is given
    assert devices.current() == [cuda[0]]


def test_a_cpu_members_futures_have_no_devices(cluster):
    import torch.distributed.rpc as rpc

    from nbrpc.calls import agent_devices, wrappers

    fut = rpc.rpc_async("worker1", len, args=([1, 2],))
    assert isinstance(fut, wrappers.NamedFuture) and fut.wait() == 2
    assert agent_devices.current() == []
    assert rpc.rpc_sync("worker1", agent_devices.current) == []


def test_a_python_functions_call_is_profiled_as_torch_profiles_it(cluster, monkeypatch):
    """Without a profiler a Python function's call goes to torch's C++ call directly;
    under one it takes torch's own path, which records the call by its function's name."""
    from torch.autograd import profiler_legacy

    from nbrpc.calls import destinations

    sent = []
    invoke = destinations.torch_compat.invoke_rpc
    monkeypatch.setattr(destinations.torch_compat, "invoke_rpc", lambda *a: sent.append(a[1]) or invoke(*a))
    assert rpc.rpc_sync("worker1", _echo, args=(1,)) == 1 and sent == []
    with profiler_legacy.profile() as prof:  # the one that records RPCs
        assert rpc.rpc_sync("worker1", _echo, args=(2,)) == 2
        assert rpc.rpc_async("worker1", _echo, args=(3,)).wait() == 3
    assert len(sent) == 2
    names = [e.name for e in prof.function_events if e.name.startswith(("rpc_sync#", "rpc_async#"))]
    assert len(names) == 2 and all("_echo" in n for n in names), names


def test_a_function_is_told_its_carrier_once_and_kept_alive_by_nothing():
    """torch's branches are asked once per function (``interrupts.sent_as``), by identity: a
    function gone leaves nothing held, and another at its id is asked again."""
    import gc
    import weakref

    from nbrpc.calls import interrupts

    def plain():
        return 1

    @rpc.functions.async_execution
    def awaited():
        return torch.futures.Future()

    assert interrupts.sent_as(plain) is interrupts.Stoppable
    assert interrupts.sent_as(plain) is interrupts.Stoppable  # (the kept answer)
    assert interrupts.sent_as(awaited) is interrupts.Awaited
    assert interrupts.sent_as(torch.add) is None
    # torch's own Python functions are asked each time: its builtin table may grow.
    assert interrupts.sent_as(torch.jit.is_scripting) is None  # a Python function, an operator to torch
    assert interrupts.sent_as(torch.nn.functional.relu) is interrupts.Stoppable
    assert id(torch.nn.functional.relu) not in interrupts._carriers
    # Except the helpers behind an RRef's proxy, which torch sends as Python functions always.
    from torch.distributed.rpc import rref_proxy

    local_invoke, local_invoke_async = rref_proxy._local_invoke, rref_proxy._local_invoke_async_execution
    assert interrupts.sent_as(local_invoke) is interrupts.Stoppable
    assert interrupts.sent_as(local_invoke_async) is interrupts.Awaited
    assert interrupts._carriers[id(local_invoke)][1] is interrupts.Stoppable
    # A stale entry at a function's id (another function, since gone) is not its answer.
    interrupts._carriers[id(plain)] = (weakref.ref(awaited), interrupts.Awaited)
    assert interrupts.sent_as(plain) is interrupts.Stoppable
    gone = weakref.ref(plain)
    del plain
    gc.collect()
    assert gone() is None
