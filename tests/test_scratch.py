"""Nothing left on the server: the folders of clusters killed outright are swept.

A worker's folder (connection file, log, kernel sockets) is removed by whoever ends the
worker. When the driver and its workers are all killed at once nobody does; the next
start on the server (or ``nbrpc sweep``) removes every folder of this user whose
owners have all ended, and nothing a live process uses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import DRIVER_START, wait_gone, wait_until

from nbrpc.shared_server import scratch

DRIVER = """
import json, os, time
import nbrpc

cluster = nbrpc.start(2, progress=None)
folders = [os.path.dirname(w.connection_file) for w in cluster.workers]
print(json.dumps({"pids": [w.pid for w in cluster.workers], "folders": folders}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_folders_of_a_cluster_killed_outright_go_at_the_next_start(drivers):
    killed = drivers(DRIVER)
    record = killed.expect("folders", DRIVER_START)
    workers, left = record["pids"], record["folders"]
    killed.pids.add(*workers)
    assert left == [_folder_of(pid) for pid in workers]
    assert all(os.path.isfile(os.path.join(f, "kernel.json")) for f in left)
    with open(os.path.join(left[0], scratch.OWNERS)) as f:
        recorded = [int(line.split()[0]) for line in f.read().splitlines()]
    assert recorded == [killed.proc.pid, workers[0]]

    # Everything at once: no watchdog is left to tidy up.
    for pid in (*workers, killed.proc.pid):
        os.kill(pid, signal.SIGKILL)
    assert not wait_gone([*workers, killed.proc.pid])
    assert all(os.path.isdir(f) for f in left)

    # The next cluster on the server sweeps them as it starts, and keeps its own.
    after = drivers(DRIVER)
    record = after.expect("folders", DRIVER_START)
    after.pids.add(*record["pids"])
    assert not [f for f in left if os.path.exists(f)]
    live = record["folders"]
    assert all(os.path.isfile(os.path.join(f, "kernel.json")) for f in live)

    # ``nbrpc sweep`` leaves a running cluster's folders alone.
    done = subprocess.run([sys.executable, "-m", "nbrpc.cli", "sweep"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("nbrpc: removed ")
    assert not set(live) & set(done.stdout.split())
    assert all(os.path.isfile(os.path.join(f, "kernel.json")) for f in live)


def test_sweep_keeps_what_is_not_its_own(tmp_path):
    """Folders of live processes, of another user, or of an older nbrpc still in use stay;
    an older nbrpc's worker folder nobody names goes once it is old."""
    base = str(tmp_path)
    dead = _make(base, "dead")
    with open(os.path.join(dead, scratch.OWNERS), "w") as f:
        f.write(f"{_ended_pid()} 1.0\n")
    reused = _make(base, "reused")  # a live pid, but not the process that made the folder
    with open(os.path.join(reused, scratch.OWNERS), "w") as f:
        f.write(f"{os.getpid()} 1.0\n")
    live = _make(base, "live")
    with open(os.path.join(live, scratch.OWNERS), "w") as f:
        f.write(f"{_ended_pid()} 1.0\n")  # its first owner ended, another still runs
    scratch.add_owner(live, os.getpid())
    others = _make(base, "others")
    if os.geteuid() == 0:
        os.chown(others, 65534, 65534)
    old, recent, unknown = (_make(base, n) for n in ("old", "recent", "unknown"))
    for folder in (old, recent):
        open(os.path.join(folder, scratch.LEGACY_LOG), "w").close()
    long_ago = time.time() - scratch.LEGACY_AGE - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(unknown, (long_ago, long_ago))
    named = _make(base, "named")
    open(os.path.join(named, scratch.LEGACY_LOG), "w").close()
    os.utime(named, (long_ago, long_ago))
    # a process that names the folder on its command line, as an older worker did
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-f",
                                os.path.join(named, "kernel.json")])
    wait_until(lambda: named.encode() in Path(f"/proc/{sleeper.pid}/cmdline").read_bytes())
    try:
        removed = scratch.sweep(base)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(removed) == sorted([dead, reused, old])
    assert {f for f in (dead, reused, live, others, old, recent, unknown, named) if os.path.isdir(f)} \
        == {live, others, recent, unknown, named}


def test_a_new_folder_is_private_and_owned():
    folder = scratch.make("test")
    try:
        assert os.stat(folder).st_mode & 0o777 == 0o700
        assert os.path.dirname(folder) == tempfile.gettempdir()
        assert scratch.owners_alive(folder) is True
        assert folder not in scratch.sweep()
    finally:
        import shutil

        shutil.rmtree(folder)


def _make(base: str, label: str) -> str:
    return tempfile.mkdtemp(prefix=f"{scratch.PREFIX}{label}-", dir=base)


def _ended_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def _folder_of(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode().split("\0")
    return os.path.dirname(argv[argv.index("-f") + 1])

