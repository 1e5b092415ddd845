"""The warm template: workers forked from it behave like launched ones; its failure modes."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch.distributed.rpc as rpc
from conftest import children, execute, find_processes, streamed, wait_until

import nbrpc
from nbrpc import settings
from nbrpc._util import pid_alive
from nbrpc.errors import WorkerStartError
from nbrpc.launchers import template

ROOT = Path(__file__).resolve().parents[1]


# Evaluated in a worker: its first draw from each random generator.
DRAW = ("__import__('torch').rand(1).item(), __import__('random').random(), "
        "float(__import__('numpy').random.rand())")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def one_worker():
    started = []

    def start(**options):
        c = nbrpc.start(1, progress=None, timeout=30, **options)
        started.append(c)
        return c

    yield start
    for c in started:
        c.shutdown()


def test_workers_are_forked_from_a_template_without_threads():
    with nbrpc.start(2, progress=None, timeout=30) as cluster:
        tp = template.current()
        assert tp is not None and tp.ready["threads"] == 1
        assert _threads(tp.pid) == 1  # still none after forking
        for w in cluster.workers:
            assert isinstance(w._popen, template.Forked)
            # Handed to the driver, which reaps it like a launched worker.
            assert _ppid(w.pid) == os.getpid()
            # In the template's session, as a launched kernel is in its own: a Ctrl-C in
            # the driver's terminal reaches neither.
            assert os.getsid(w.pid) == os.getsid(tp.pid) != os.getsid(0)
            with open(f"/proc/{w.pid}/cmdline", "rb") as f:
                assert b"nbrpc.member.worker" in f.read()
        assert [rpc.rpc_sync(w.name, os.getpid) for w in cluster.workers] == [w.pid for w in cluster.workers]
        assert {rpc.rpc_sync(w.name, os.getcwd) for w in cluster.workers} == {os.getcwd()}
        one, two = (rpc.rpc_sync(w.name, eval, args=(DRAW,)) for w in cluster.workers)
        assert all(a != b for a, b in zip(one, two)), (one, two)
        pids = [w.pid for w in cluster.workers]
    assert not [p for p in pids if pid_alive(p)]
    assert None not in [w.exit_code() for w in cluster.workers]


def test_what_a_kernel_imports_as_it_starts_is_imported_once_in_the_template(one_worker):
    from nbrpc.member import template_process

    # Every name still exists: a renamed one would be skipped quietly, and each worker
    # would import its replacement again as its kernel starts.
    for name in template_process.KERNEL_IMPORTS:
        assert importlib.util.find_spec(name) is not None, name
    # The template has them: sqlite3's C extension (the kernel's history) is mapped there.
    one_worker()
    with open(f"/proc/{template.current().pid}/maps") as f:
        assert "_sqlite3" in f.read()


def test_a_killed_forked_worker_says_how_it_ended(one_worker):
    cluster = one_worker()
    w = cluster.workers[0]
    os.kill(w.pid, signal.SIGKILL)
    wait_until(lambda: not w.alive())
    assert w.fate() == f"(pid {w.pid}) was killed by signal 9"


def test_template_dies_the_next_cluster_starts_a_new_one(one_worker):
    cluster = one_worker()
    old = template.current()
    os.kill(old.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(old.pid))
    # Its workers are the driver's children: they outlive it.
    assert rpc.rpc_sync("worker1", os.getpid, timeout=10) == cluster.workers[0].pid
    cluster.shutdown()
    again = one_worker()
    assert template.current() is not old and template.current().alive()
    assert isinstance(again.workers[0]._popen, template.Forked)
    assert rpc.rpc_sync("worker1", os.getpid, timeout=10) == again.workers[0].pid


def test_start_variables_set_later_get_a_new_template(one_worker, monkeypatch):
    first = one_worker()
    old = template.current()
    first.shutdown()
    # what importing some libraries does (scikit-learn sets KMP_INIT_AT_FORK, say)
    monkeypatch.setenv("OMP_DISPLAY_ENV", "FALSE" if os.environ.get("OMP_DISPLAY_ENV") != "FALSE" else "false")
    again = one_worker()
    assert template.current() is not old and not pid_alive(old.pid)
    assert isinstance(again.workers[0]._popen, template.Forked)  # still warm, not fresh
    with open(f"/proc/{again.workers[0].pid}/environ", "rb") as f:
        assert f"OMP_DISPLAY_ENV={os.environ['OMP_DISPLAY_ENV']}".encode() in f.read().split(b"\0")


def test_a_fork_that_fails_is_a_clear_error_and_leaks_nothing(tmp_path):
    template.prestart()
    tp = template.current()
    assert tp.wait_ready(60)
    before = set(children(os.getpid()))
    log = tmp_path / "output.log"
    log.write_bytes(b"")
    env = {**os.environ, **settings.FAST_ALLOC_ENV}
    with pytest.raises(WorkerStartError, match=r"could not be forked.*FileNotFoundError.*no-such-folder"):
        template.launch("worker9", ["-f", str(tmp_path / "kernel.json")], env, str(tmp_path / "no-such-folder"),
                        str(log))
    time.sleep(0.2)
    leaked = [p for p in set(children(os.getpid())) - before if pid_alive(p)]
    assert leaked == []
    assert template.current() is tp and tp.alive() and _threads(tp.pid) == 1


def test_warm_start_can_be_turned_off(one_worker, monkeypatch):
    cluster = one_worker(warm_start=False)
    assert not isinstance(cluster.workers[0]._popen, template.Forked)
    assert rpc.rpc_sync("worker1", os.getpid, timeout=10) == cluster.workers[0].pid
    monkeypatch.setenv(template.WARM_START_ENV, "0")
    assert not template.enabled() and nbrpc.Cluster(1).warm_start is False
    assert template.enabled(True)


DRIVER = """
import time, nbrpc
nbrpc.start(4, progress=None, timeout=30)
time.sleep(600)
"""


def test_driver_killed_mid_fork_leaves_no_process(tmp_path, pids):
    mark = uuid.uuid4().hex
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NBRPC_MID_FORK_MARK": mark}
    driver = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    pids.add(driver.pid)
    deadline = time.monotonic() + 60
    # Kill the driver as soon as its first worker exists: the others are being forked.
    while not [p for p in _marked(mark) if _is_worker(p)]:
        assert driver.poll() is None and time.monotonic() < deadline, "no worker was forked"
        time.sleep(0.005)
    family = _marked(mark)
    pids.add(*family)
    assert any(_is_template(p) for p in family)
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 15
    while _marked(mark) and time.monotonic() < deadline:
        pids.add(*_marked(mark))
        time.sleep(0.1)
    assert _marked(mark) == []


def _marked(mark: str) -> list[int]:
    """Live processes (not this one) forked for the mid-fork test, by their mark."""
    return sorted(find_processes("", f"NBRPC_MID_FORK_MARK={mark}") - {os.getpid()})


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_worker(pid: int) -> bool:
    return b"nbrpc.member.worker" in _cmdline(pid)


def _is_template(pid: int) -> bool:
    return b"nbrpc.member.template_process" in _cmdline(pid)


SIBLING_DRIVER = """
import json
import torch.distributed.rpc as rpc
import nbrpc
from shapes import area  # a module beside this script, as in a project's folder

cluster = nbrpc.start(1, progress=None)
print(json.dumps({"area": rpc.rpc_sync("worker1", area, args=(3, 4)),
                  "pids": [w.pid for w in cluster.workers]}), flush=True)
cluster.shutdown()
"""


@pytest.mark.parametrize("warm", ["1", "0"])
def test_workers_import_the_driver_scripts_sibling_modules(tmp_path, pids, warm):
    """As mp.spawn's children can: the script runs from another folder, its module is not
    on the workers' own path (their folder is the driver's working directory)."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "shapes.py").write_text("import os\n\ndef area(w, h):\n    return w * h, os.getpid()\n")
    (app / "driver.py").write_text(SIBLING_DRIVER)
    env = {**os.environ, settings.WARM_START_ENV: warm}
    proc = subprocess.Popen([sys.executable, str(app / "driver.py")], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids.add(proc.pid)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    record = json.loads(out.strip().splitlines()[-1])
    value, worker_pid = record["area"]
    assert value == 12 and [worker_pid] == record["pids"] != [proc.pid]


IMPORT_IN_KERNEL = """
import json, os, time
began = time.monotonic()
import nbrpc
imported = time.monotonic()
from nbrpc.launchers import template
t = template.current()
print(json.dumps({"template": t.pid, "alive": t.alive(), "started": t.started - began,
                  "imported": imported - began, "kernel": os.getpid()}))
"""


def test_a_notebook_that_imports_nbrpc_starts_the_template_beside_its_own_import(kernel, pids):
    """The template's import of torch overlaps the kernel's (a first %rpc_init then waits
    for no import); a script's ``import nbrpc`` starts nothing."""
    _, kc = kernel
    messages, reply = execute(kc, IMPORT_IN_KERNEL)
    assert reply["status"] == "ok", reply
    found = json.loads(streamed(messages).strip().splitlines()[-1])
    pids.add(found["template"])
    assert found["alive"] and _is_template(found["template"]) and found["template"] in children(found["kernel"])
    # started before nbrpc imported torch, not after
    assert found["started"] < 0.5 * found["imported"], found
    script = subprocess.run([sys.executable, "-c", "import nbrpc\nfrom nbrpc.launchers import template\n"
                             "print(template.current())"], capture_output=True, text=True, timeout=120)
    assert script.stdout.strip() == "None", script.stderr[-2000:]
