"""Limits a server's administrator sets for every user (a teacher for a class's hub).

Read from a file or from the environment the hub gives each server; a cluster over a
limit is refused before anything starts, with the limit and who set it named.
"""

from __future__ import annotations

import pytest
from conftest import DRIVER_START, worker_pids
from IPython.core.error import UsageError

import nbrpc
from nbrpc.errors import LimitError
from nbrpc.shared_server import limits

FILE = """
max_workers = 3
threads = 4
max_timeout = 120
"""


def test_limits_come_from_the_file_then_the_hubs_environment(tmp_path):
    path = tmp_path / "limits.toml"
    path.write_text(FILE)
    got = limits.load({"NBRPC_LIMITS": str(path)})
    assert (got.max_workers, got.threads, got.max_timeout) == (3, 4, 120)
    assert got.who("max_workers") == f"set in {path}"

    over = limits.load({"NBRPC_LIMITS": str(path), "NBRPC_MAX_WORKERS": "6", "NBRPC_MAX_TIMEOUT": "30.5"})
    assert (over.max_workers, over.threads, over.max_timeout) == (6, 4, 30.5)
    assert over.who("max_workers") == "set by NBRPC_MAX_WORKERS in the environment the server started with"
    assert over.who("threads") == f"set in {path}"


def test_no_limits_where_none_are_set(tmp_path):
    got = limits.load({"NBRPC_LIMITS": ""})  # an empty variable: the default file, absent here
    assert (got.max_workers, got.threads, got.max_timeout) == (None, None, None)
    got.check_workers(500, 500)
    assert got.resolve_timeout(None, 60.0) == 60.0 and got.resolve_timeout(1e6, 60.0) == 1e6


@pytest.mark.parametrize("content, environ, says", [
    ("max_workers = 0", {}, "max_workers must be a positive whole number, got 0"),
    ("max_workers = 2.5", {}, "max_workers must be a positive whole number, got 2.5"),
    ("max_timeout = -1", {}, "max_timeout must be a positive number, got -1"),
    ("most_workers = 3", {}, "unknown keys most_workers; known: max_workers, threads, max_timeout"),
    ("max_workers = [", {}, "cannot be read"),
    ("", {"NBRPC_DEFAULT_THREADS": "many"}, "NBRPC_DEFAULT_THREADS='many' is not a number"),
], ids=["zero", "fraction", "negative", "unknown key", "not toml", "bad variable"])
def test_bad_limits_are_named_with_where_they_were_set(tmp_path, content, environ, says):
    path = tmp_path / "limits.toml"
    path.write_text(content)
    with pytest.raises(ValueError) as e:
        limits.load({"NBRPC_LIMITS": str(path), **environ})
    assert says in str(e.value)
    assert "administrator" in str(e.value) or "known:" in str(e.value)


def test_a_missing_limits_file_named_by_the_environment_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="names no file"):
        limits.load({"NBRPC_LIMITS": str(tmp_path / "none.toml")})


@pytest.fixture
def limited(tmp_path, monkeypatch):
    path = tmp_path / "limits.toml"
    path.write_text(FILE)
    monkeypatch.setenv("NBRPC_LIMITS", str(path))
    return path


def test_rpc_init_over_a_limit_says_which_and_who_sets_it_and_starts_nothing(ip, limited):
    before = worker_pids()
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("rpc_init", "-n 50")
    message = str(e.value)
    assert message.startswith("%rpc_init: 50 local workers asked for, but this server allows at most 3 per user")
    assert f"(the limit max_workers, set in {limited})" in message
    assert "ask the server's administrator (your teacher on a class's hub) to raise the limit" in message
    with pytest.raises(UsageError, match=r"an RPC timeout of 500 s asked for, but this server allows at most "
                                         r"120 s \(the limit max_timeout, set in .*\)\. Ask for 120 s or less "
                                         r"\(%rpc_init --timeout 120\)"):
        ip.run_line_magic("rpc_init", "-n 1 --timeout 500")
    with pytest.raises(LimitError):
        nbrpc.Cluster(50)  # the Python API the same
    assert nbrpc.current() is None
    assert worker_pids() == before


SERVER_DEFAULTS = """
import json
import torch.distributed.rpc as rpc
import nbrpc

cluster = nbrpc.start(1, progress=None)
print(json.dumps({"seen": [cluster.threads, cluster.timeout, rpc.get_rpc_timeout(),
                           int(rpc._get_debug_info()["agent.thread_pool_size"]),
                           rpc.rpc_sync("worker1", rpc.get_rpc_timeout),
                           int(rpc.rpc_sync("worker1", rpc._get_debug_info)["agent.thread_pool_size"])]}),
      flush=True)
cluster.shutdown()
"""


def test_the_servers_default_threads_and_longest_timeout_reach_every_member(drivers, limited, monkeypatch):
    """In a process of its own, as a new kernel: a process keeps its first join's threads."""
    monkeypatch.setenv("NBRPC_MAX_TIMEOUT", "45")  # the hub's variable over the file's 120
    monkeypatch.setenv("NBRPC_MAX_WORKERS", "100000")  # this machine's other workers are ours too
    driver = drivers(SERVER_DEFAULTS)
    assert driver.expect("seen", DRIVER_START)["seen"] == [4, 45, 45, 4, 45, 4]
    assert driver.proc.wait(timeout=60) == 0


STUDENT_DRIVER = """
import json, time
import nbrpc
from nbrpc.errors import LimitError

cluster = nbrpc.start(2, progress=None)
print(json.dumps({"pids": [w.pid for w in cluster.workers]}), flush=True)
time.sleep(600)
"""

SECOND_NOTEBOOK = """
import json
import nbrpc
from nbrpc.errors import LimitError

try:
    nbrpc.start(2, progress=None)
except LimitError as e:
    print(json.dumps({"refused": str(e)}), flush=True)
cluster = nbrpc.start(1, progress=None)
print(json.dumps({"started": [w.pid for w in cluster.workers]}), flush=True)
cluster.shutdown()
print(json.dumps({"done": True}), flush=True)
"""


def test_most_workers_per_user_counts_all_their_notebooks(drivers, student):
    """Each user's workers count against their own limit: a real second user, so that
    this machine's other workers (ours) do not count."""
    student.extra_env = {"NBRPC_MAX_WORKERS": "3"}
    first = drivers(STUDENT_DRIVER, user=student)
    first.worker_pids()
    second = drivers(SECOND_NOTEBOOK, user=student)
    refused = second.expect("refused", DRIVER_START)["refused"]
    assert refused == (
        "2 local workers asked for, but this server allows at most 3 per user, and you run 2 already "
        "(in other notebooks or kernels) (the limit max_workers, set by NBRPC_MAX_WORKERS in the "
        "environment the server started with). Ask for at most 1 (%rpc_init -n 1), or ask the server's "
        "administrator (your teacher on a class's hub) to raise the limit.")
    second.pids.add(*second.expect("started", DRIVER_START)["started"])
    assert second.expect("done", 60) == {"done": True}
