"""Bad input gets a clear error naming what was wrong, never a hang, and loses nothing.

After every test the cluster must still answer (``cluster_still_works``).
"""

from __future__ import annotations

import errno
import operator
import socket
import threading
import time

import psutil
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import run
from IPython.core.error import UsageError

import nbrpc
from nbrpc._util import listening_socket
from nbrpc.group import membership


def worker_children() -> set[int]:
    """Pids of worker kernels this process started."""
    found = set()
    for child in psutil.Process().children():
        try:
            if "nbrpc.member.worker" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.Error:  # ended, or a zombie, meanwhile
            pass
    return found



@pytest.fixture(autouse=True)
def cluster_still_works(cluster):
    """Every error leaves the same cluster running, and both workers answer."""
    pids = {w.name: w.pid for w in cluster.workers}
    yield
    assert nbrpc.current() is cluster
    assert worker_children() == set(pids.values())
    for w in cluster.workers:
        assert w.state == "running" and w.pid == pids[w.name]
        assert rpc.rpc_sync(w.name, operator.mul, args=(6, 7), timeout=10) == 42


# -- unknown worker --------------------------------------------------------------

CALLS = {
    "rpc_sync": lambda to: rpc.rpc_sync(to, operator.add, args=(1, 2)),
    "rpc_async": lambda to: rpc.rpc_async(to, operator.add, args=(1, 2)).wait(),
    "remote": lambda to: rpc.remote(to, operator.add, args=(1, 2)).to_here(),
}


@pytest.mark.parametrize("call", CALLS)
def test_unknown_worker_in_rpc_calls(cluster, call):
    with pytest.raises(nbrpc.UnknownWorkerError) as info:
        CALLS[call]("worker3")
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'worker3'" in message
    assert "the workers are: master, worker1, worker2" in message
    # what torch raises for an unknown name or rank (its test_send_to_rank expects it).
    # Ranks are never reused (see membership), so this cluster's workers need not be 1
    # and 2: a fixed number could be one of them. The unknown ranks are one past the
    # highest member's, and one this process's earlier clusters used, if any.
    ranks = {rpc.get_worker_info(name).id for name in ("master", "worker1", "worker2")}
    assert ranks == {0} | {w.rank for w in cluster.workers}
    unknown = [max(ranks) + 1] + sorted(set(range(max(ranks))) - ranks)[-1:]
    for rank in unknown:
        with pytest.raises(RuntimeError, match=f"no worker with id {rank} in this RPC group"):
            CALLS[call](rank)


def test_unknown_worker_in_run_runs_nowhere(cluster, shell):
    with pytest.raises(nbrpc.UnknownWorkerError) as info:
        cluster.run("ran_here = True", "worker1,worker3")
    assert "'worker3'" in str(info.value)
    assert "worker1, worker2" in str(info.value)
    # worker1 was named too, but nothing ran anywhere
    check = "'ran_here' in __import__('__main__').__dict__"
    assert rpc.rpc_sync("worker1", eval, args=(check,)) is False

    with pytest.raises(nbrpc.UnknownWorkerError) as info:
        shell.run_cell_magic("rpc_on", "worker3", "ran_here = True")
    assert "'worker3'" in str(info.value) and "worker1, worker2" in str(info.value)
    assert rpc.rpc_sync("worker1", eval, args=(check,)) is False


# -- unpicklable values ----------------------------------------------------------


def test_unpicklable_argument_is_named(cluster):
    lock = threading.Lock()
    calls = {
        "rpc_sync": lambda: rpc.rpc_sync("worker1", print, args=(torch.ones(2), lock)),
        "rpc_async": lambda: rpc.rpc_async("worker1", print, args=(torch.ones(2), lock)),
        "remote": lambda: rpc.remote("worker1", print, args=(torch.ones(2), lock)),
    }
    for call in calls.values():
        with pytest.raises(nbrpc.SerializationError) as info:
            call()
        assert isinstance(info.value, TypeError)
        message = str(info.value)
        assert message.startswith("cannot send argument 1 (lock) over RPC: cannot pickle '_thread.lock'")
        assert "rpc.remote(worker, Class" in message  # what to do instead
        assert info.value.__cause__ is not None

    with pytest.raises(nbrpc.SerializationError, match=r"keyword argument 'guard' \(lock\)"):
        rpc.rpc_sync("worker1", print, args=(1,), kwargs={"sep": " ", "guard": lock})


def test_unpicklable_global_is_named_with_the_function_using_it(shell):
    run(shell, "held = (i for i in range(3))")
    expected = r"cannot send the global 'held' \(generator\) that <lambda> uses over RPC"
    with pytest.raises(nbrpc.SerializationError, match=expected):
        run(shell, 'rpc.rpc_sync("worker1", lambda: next(held))')


def test_unpicklable_result_names_the_worker(cluster):
    with pytest.raises(nbrpc.SerializationError) as info:
        rpc.rpc_sync("worker2", threading.Lock)
    message = str(info.value)
    assert message.startswith(
        "rpc_sync('worker2', allocate_lock) ran on 'worker2' but its reply could not be sent"
    )
    assert "cannot send the result (lock) over RPC" in message
    assert "frame #" not in message  # torch's C++ stack stays out of it


# -- exceptions in remote code ---------------------------------------------------


def test_exception_in_remote_function_shows_worker_and_traceback(shell):
    run(shell, """
def failing_step(x):
    raise ValueError(f"bad value {x}")
""")
    worker_id = rpc.get_worker_info("worker1").id
    attempts = {
        "rpc_sync": 'rpc.rpc_sync("worker1", failing_step, args=(5,))',
        "rpc_async": 'rpc.rpc_async("worker1", failing_step, args=(5,)).wait()',
        "remote": 'rpc.remote("worker1", failing_step, args=(5,)).to_here()',
    }
    for code in attempts.values():
        with pytest.raises(ValueError) as info:
            run(shell, code)
        message = str(info.value)
        assert f"On WorkerInfo(id={worker_id}, name=worker1):" in message
        assert "ValueError('bad value 5')" in message
        assert "Traceback (most recent call last)" in message
        assert ", in failing_step" in message


def test_exception_of_a_notebook_class_keeps_its_class(shell):
    run(shell, """
class ShardMissing(LookupError):
    pass
class NeedsTwoArguments(Exception):
    def __init__(self, shard, reason):
        super().__init__(shard, reason)
def lose_shard(n):
    raise ShardMissing(f"shard {n} is gone")
def fail_oddly():
    raise NeedsTwoArguments(3, "odd")
""")
    for call in ('rpc.rpc_sync("worker1", lose_shard, args=(7,))',
                 'rpc.rpc_async("worker1", lose_shard, args=(7,)).wait()',
                 'rpc.remote("worker1", lose_shard, args=(7,)).to_here()'):
        with pytest.raises(shell.user_ns["ShardMissing"]) as info:
            run(shell, call)
        # the notebook's own class; where torch raises a RuntimeError in its place (not
        # to_here, which raises it as it is), one of those too
        assert nbrpc.errors.remote_class(info.value) is shell.user_ns["ShardMissing"], call
        assert isinstance(info.value, RuntimeError) is not call.endswith("to_here()"), call
        assert "ShardMissing('shard 7 is gone')" in str(info.value)
        assert ", in lose_shard" in str(info.value)
    # a class torch cannot re-create from a message keeps torch's text
    with pytest.raises(RuntimeError, match="Failed to create original exception type"):
        run(shell, 'rpc.rpc_sync("worker1", fail_oddly)')


def test_exception_in_run_shows_worker_and_traceback(cluster):
    code = "def load_batch():\n    raise KeyError('missing shard')\nload_batch()"
    with pytest.raises(nbrpc.RemoteError) as info:
        cluster.run(code, "worker2")
    error = info.value
    assert str(error) == "code raised on worker2: KeyError: 'missing shard'"
    ename, evalue, traceback = error.failures["worker2"]
    assert (ename, evalue) == ("KeyError", "'missing shard'")
    assert "load_batch" in "\n".join(traceback)
    rendered = "\n".join(error._render_traceback_())
    assert "[worker2]" in rendered and "load_batch" in rendered


# -- timeouts --------------------------------------------------------------------


@pytest.mark.parametrize("torch_said", ["EOF: end of file", "ECONNRESET: connection reset by peer",
                                        "EPIPE: broken pipe"])
def test_a_dropped_connection_waits_for_the_workers_fate_and_names_it(torch_said):
    """A worker's process that ended (a scheduler's time limit, a kill) drops its connection
    a moment before the launcher's watch sees it end: torch's error, whichever way the
    connection dropped (a Slurm time limit once gave ECONNRESET), waits for the worker's
    fate and becomes ``WorkerDiedError`` naming it."""
    from nbrpc.calls import failures

    told = time.monotonic() + 0.3  # when the watch sees the process end

    def fate(name: str) -> str | None:
        return "ended: its job reached its time limit (TIMEOUT)" if name == "gone" and time.monotonic() > told else None

    error = RuntimeError(f"{torch_said} (this error originated at tensorpipe/transport/uv/connection_impl.cc:132)")
    failures.WORKER_FATES.add(fate)
    try:
        found = failures.named(error, "gone", "rpc_sync('gone', sleep)", 5.0)
        began = time.monotonic()  # any other error of a worker that runs is left as it is, at once
        other = RuntimeError("a remote function's own RuntimeError")
        assert failures.named(other, "running", "rpc_sync('running', f)", 5.0) is other
        assert time.monotonic() - began < 0.5
    finally:
        failures.WORKER_FATES.discard(fate)
    assert isinstance(found, nbrpc.WorkerDiedError)
    assert "worker 'gone' ended: its job reached its time limit (TIMEOUT)" in str(found)
    assert torch_said in str(found)


def test_timeout_names_the_worker(cluster):
    began = time.monotonic()
    with pytest.raises(nbrpc.RpcTimeoutError) as info:
        rpc.rpc_sync("worker1", time.sleep, args=(3,), timeout=1)
    elapsed = time.monotonic() - began
    assert isinstance(info.value, TimeoutError)
    assert 0.9 < elapsed < 2.9  # the call gave up before the 3 s sleep ended
    message = str(info.value)
    assert message.startswith("rpc_sync('worker1', sleep) got no answer within 1 s")
    assert "timeout=SECONDS" in message


def test_timeout_is_still_torchs_error(cluster):
    """Code written against torch's timeout (a RuntimeError whose message says so, as
    torch's own RPC tests match it) still catches nbrpc's."""
    with pytest.raises(RuntimeError, match="RPC ran for more than set timeout") as info:
        rpc.rpc_sync("worker1", time.sleep, args=(2,), timeout=0.5)
    assert isinstance(info.value, nbrpc.RpcTimeoutError)
    with pytest.raises(RuntimeError, match="RPC ran for more than set timeout"):
        rpc.rpc_async("worker1", time.sleep, args=(2,), timeout=0.5).wait()


# -- invalid options -------------------------------------------------------------

BAD_OPTIONS = [
    (dict(n=0), "got 0"),
    (dict(n=-1), "got -1"),
    (dict(n=2.5), "got 2.5"),
    (dict(names=["a", "a"]), "repeated: a"),
    (dict(names=["worker1"], driver_name="worker1"), "repeated: worker1"),
    (dict(names=["worker one"]), "invalid worker name 'worker one'"),
    (dict(names=["w/1"]), "invalid worker name 'w/1'"),
    (dict(names=[]), "at least one worker name"),
    (dict(names=[""]), "invalid worker name ''"),
    (dict(n=3, names=["a", "b"]), "n=3 but 2 names"),
    (dict(threads=0), "threads must be a positive number, got 0"),
    (dict(timeout=-1), "timeout must be a positive number, got -1"),
    (dict(startup_timeout=0), "startup_timeout must be a positive number, got 0"),
]


@pytest.mark.parametrize("options, expected", BAD_OPTIONS, ids=[str(o) for o, _ in BAD_OPTIONS])
def test_invalid_options_raise_value_error_and_start_nothing(cluster, options, expected):
    before = worker_children()
    with pytest.raises(ValueError) as info:
        nbrpc.Cluster(**options)
    assert expected in str(info.value)
    assert worker_children() == before


BAD_LINES = [
    ("-n 0", "got 0"),
    ("-n -1", "got -1"),
    ("-n two", "invalid int value"),
    ("--names a,a", "repeated: a"),
    ("--names worker.1", "invalid worker name 'worker.1'"),
    ("--names w/1", "invalid worker name 'w/1'"),
    ("--driver-name worker1 -n 1", "repeated: worker1"),
    ("--threads 0", "threads must be a positive number, got 0"),
    ("--timeout -1", "timeout must be a positive number, got -1"),
    ("--bogus 3", "unrecognized arguments: --bogus 3"),
]


@pytest.mark.parametrize("line, expected", BAD_LINES, ids=[line for line, _ in BAD_LINES])
def test_invalid_rpc_init_options_raise_usage_error(shell, line, expected):
    # A cluster runs: an option that got past validation would fail differently.
    before = worker_children()
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("rpc_init", line)
    assert expected in str(info.value)
    assert worker_children() == before


def test_rpc_init_while_a_cluster_runs(shell, cluster):
    before = worker_children()
    attempts = (lambda: shell.run_line_magic("rpc_init", "-n 1"), lambda: nbrpc.start(1, progress=None))
    for attempt in attempts:
        with pytest.raises(nbrpc.ClusterRunningError) as info:
            attempt()
        assert "already running" in str(info.value)
        assert "%rpc_shutdown" in str(info.value)
        assert worker_children() == before


# -- ports -----------------------------------------------------------------------


def test_port_in_use_names_the_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        for attempt in (lambda: listening_socket("127.0.0.1", port),
                        lambda: membership.host_store("127.0.0.1", port, 5)):
            began = time.monotonic()
            with pytest.raises(OSError) as info:
                attempt()
            assert time.monotonic() - began < 2
            assert info.value.errno == errno.EADDRINUSE
            message = str(info.value)
            assert f"127.0.0.1:{port}" in message
            assert "choose another" in message
