"""Workers in Slurm jobs, against a real single-node Slurm (``minislurm``).

munged, slurmctld and slurmd run for this module (state in a temporary folder); the
tests submit with the real ``sbatch``/``srun`` and read the real ``squeue``. Drivers
run as scripts (``drivers``) or notebook kernels, on loopback.

Slurm's records without slurmdbd: there is no ``sacct``, so "the token is not in
Slurm's records" is checked on everything Slurm keeps of a job: ``scontrol show job
-dd``, the stored batch script (``scontrol write batch_script``), every file under
slurmctld's state folder (the job's stored environment among them) and slurmd's
spool, the daemons' logs, and every process's command line.

Without root or Slurm the module skips, saying why; with ``CI=true`` it fails instead.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import minislurm
import pytest
from conftest import execute_cells, find_processes, wait_gone, wait_until
from unix_socket_kernels import UnixSocketKernelManager

import nbrpc
from nbrpc.errors import JobRefusedError
from nbrpc.group import membership

pytestmark = [pytest.mark.slow]

START = 180.0  # a driver importing torch and its workers joining, on a loaded machine
CANCELLED_WITHIN = 10.0

HEADER = """
import json, os, sys, time
import torch
import torch.distributed.rpc as rpc
import nbrpc

def say(**record):
    print(json.dumps(record, default=str), flush=True)

PROGRESS = []

def report(done, total, message):
    PROGRESS.append(message)
    say(progress=message, t=time.monotonic())

def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.05)

def workers(c):
    return [[w.name, w.host, w.job, w.pid] for w in c.workers]
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real Slurm for this module; every job, daemon and step daemon ended by pid after it."""
    reason = minislurm.unavailable()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm tests: {reason}")
        pytest.skip(reason)
    instance = minislurm.MiniSlurm(tmp_path_factory.mktemp("slurm"))
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = instance.conf
    try:
        instance.start()
        yield instance
    finally:
        survivors = instance.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        daemons = [p.pid for p in instance.processes.values() if p.poll() is None]
        assert not survivors and not daemons, f"Slurm processes survived: {survivors + daemons}"


@pytest.fixture
def queue_empty(slurm):
    """Each test starts with an empty queue and must leave it empty."""
    assert slurm.queue() == [], f"jobs left over: {slurm.queue()}"
    yield
    left = wait_until(lambda: not slurm.queue(), CANCELLED_WITHIN) or slurm.queue()
    assert left is True or left == [], f"jobs left in squeue: {left}"


@pytest.fixture
def blocker(slurm):
    """A job holding every CPU of the node, so the next job waits (reason: Resources)."""
    done = slurm.command("sbatch", "--parsable", "--job-name=blocker", f"--ntasks={minislurm.CPUS}",
                         "--output=/dev/null", "--wrap", "sleep 600")
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip()
    assert wait_until(lambda: slurm.job_state(job) == "RUNNING", 30), slurm.job_state(job)
    yield job
    slurm.command("scancel", job)
    wait_until(lambda: slurm.job_state(job) not in ("RUNNING", "COMPLETING"), 30)


def _start(drivers, body: str, **cluster):
    options = ", ".join(f"{k}={v!r}" for k, v in {"bind": "127.0.0.1", "progress": "PROGRESS", **cluster}.items())
    options = options.replace("'PROGRESS'", "report")
    return drivers(HEADER + f"c = nbrpc.start({options})\n" + body)


def _secrets_in(folder: str, token: bytes) -> list[str]:
    """Files under ``folder`` that contain ``token``."""
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as f:
                    if token in f.read():
                        found.append(os.path.join(root, name))
            except OSError:
                pass
    return found


def _command_lines_with(token: bytes) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if token in f.read():
                        found.append(entry)
            except OSError:
                pass
    return found


def test_job_runs_workers_keeps_token_out_of_slurm_and_ends_at_shutdown(slurm, drivers, pids, queue_empty, tmp_path):
    driver = _start(drivers, """
say(job=c.launcher.job, token=c.launcher.token, folder=c.launcher.folder, workers=workers(c),
    status=c.status(), progress_seen=PROGRESS,
    value=rpc.rpc_sync("worker2", torch.add, args=(torch.ones(2), 1)).tolist())
wait_for("proceed")
t = time.monotonic()
c.shutdown()
say(shutdown=time.monotonic() - t, folder_left=os.path.exists(c.launcher.folder))
""", n=2, slurm={"time_limit": "10", "job_name": "nbrpc-test"}, startup_timeout=120.0)
    up = driver.expect("job", START)
    job, token = up["job"], up["token"].encode()
    pids.add(*(w[3] for w in up["workers"]))
    assert up["value"] == [2.0, 2.0]
    assert [(w[0], w[1], w[2]) for w in up["workers"]] == [("worker1", slurm.host, job), ("worker2", slurm.host, job)]
    assert [(row["name"], row.get("job")) for row in up["status"]] == [("master", None), ("worker1", job),
                                                                       ("worker2", job)]
    assert slurm.queue() == [f"{job} RUNNING nbrpc-test"]
    shown = slurm.command("scontrol", "show", "job", "-dd", job).stdout
    assert f"JobId={job}" in shown and "TimeLimit=00:10:00" in shown and "NumTasks=2" in shown
    script = slurm.command("scontrol", "write", "batch_script", job, "-").stdout
    assert "srun" in script and "nbrpc.cli worker --join 127.0.0.1:" in script
    assert token not in shown.encode() and token not in script.encode()
    assert _secrets_in(os.path.join(slurm.folder), token) == []  # state (the job's environment), spool, logs
    assert _command_lines_with(token) == []
    assert os.stat(up["folder"]).st_mode & 0o077 == 0
    assert os.stat(os.path.join(up["folder"], "token")).st_mode & 0o077 == 0
    progress = up["progress_seen"]
    assert progress[0] == f"Slurm job {job} submitted"
    assert any(re.fullmatch(rf"job {job} running on {slurm.host} after [\d.]+ s in the queue", p) for p in progress)
    (tmp_path / "proceed").touch()
    ended = driver.expect("shutdown", 60)
    assert ended["shutdown"] < CANCELLED_WITHIN and not ended["folder_left"]
    assert slurm.queue() == []
    assert slurm.job_state(job) in ("COMPLETED", "CANCELLED")
    assert not wait_gone([w[3] for w in up["workers"]], 5)
    queued = next(p for p in progress if " in the queue" in p)
    print(f"\nslurm job {job}: {queued}; cluster start (sbatch to every worker joined): "
          f"{next(p for p in progress if ' up in ' in p).rsplit(' up in ', 1)[1]}; shutdown with the job gone "
          f"from squeue in {ended['shutdown']:.2f} s")


@pytest.mark.parametrize("while_", ["running", "pending"])
def test_driver_killed_cancels_the_job(slurm, drivers, pids, queue_empty, request, while_):
    if while_ == "pending":
        request.getfixturevalue("blocker")
    driver = _start(drivers, "", n=2, slurm=True)
    if while_ == "running":
        up = driver.expect("progress", START)
        while "up in" not in up["progress"]:
            up = driver.expect("progress", START)
    else:
        while "pending: Resources" not in driver.expect("progress", START)["progress"]:
            pass
    job = next(line.split()[0] for line in slurm.queue() if "nbrpc-master" in line)
    workers = [int(p) for p in _worker_pids_of(slurm)]
    pids.add(*workers)
    os.kill(driver.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert wait_until(lambda: not any(line.startswith(f"{job} ") for line in slurm.queue()), CANCELLED_WITHIN), \
        slurm.queue()
    print(f"\ndriver killed while the job {while_}: job {job} gone from squeue in {time.monotonic() - killed:.2f} s")
    assert not wait_gone(workers, 5)
    assert slurm.job_state(job) in ("CANCELLED", "COMPLETED", "FAILED")


def _worker_pids_of(slurm) -> list[int]:
    """Worker processes started by this Slurm (``nbrpc.cli worker`` in one of its jobs,
    whose environment names its configuration): not another Slurm's on the machine."""
    return sorted(find_processes("nbrpc.cli worker", f"SLURM_CONF={slurm.conf}"))


def test_pending_job_reports_the_reason_and_the_start_timeout_counts_from_the_run(
        slurm, drivers, pids, queue_empty, blocker):
    startup_timeout = 40.0
    driver = _start(drivers, "say(up=workers(c))\nc.shutdown()\nsay(done=True)\n",
                    n=1, slurm=True, startup_timeout=startup_timeout)
    first = None
    while True:
        message = driver.expect("progress", START)
        match = re.fullmatch(r"job (\d+) pending: (.*), (\d+) s", message["progress"])
        if match and match.group(2) == "Resources":
            first = first or message["t"]
            if message["t"] - first > startup_timeout + 5:
                break
    job = match.group(1)
    assert slurm.job_state(job) == "PENDING"
    slurm.command("scancel", blocker)
    began = time.monotonic()
    up = driver.expect("up", START)
    pids.add(*(w[3] for w in up["up"]))
    assert [w[2] for w in up["up"]] == [job]
    driver.expect("done", 60)
    print(f"\njob {job} waited > {startup_timeout + 5:.0f} s in the queue (Resources), "
          f"then its worker joined {time.monotonic() - began:.1f} s after the blocker was cancelled")


def test_queue_timeout_and_interrupt_cancel_a_pending_job(slurm, drivers, pids, queue_empty, blocker, tmp_path):
    driver = drivers(HEADER + """
try:
    nbrpc.start(1, bind="127.0.0.1", progress=report, slurm={"queue_timeout": 3})
except nbrpc.WorkerStartError as e:
    say(error=str(e))
try:
    nbrpc.start(1, bind="127.0.0.1", progress=report, slurm=True)
except KeyboardInterrupt:
    say(interrupted=time.monotonic())
""")
    error = driver.expect("error", START)["error"]
    assert re.search(r"Slurm job \d+ still pending after \d+ s \(queue_timeout=3 s; Slurm's reason: Resources\); "
                     r"it is cancelled", error), error
    job = re.search(r"Slurm job (\d+)", error).group(1)
    assert slurm.job_state(job) == "CANCELLED"
    while "pending: Resources" not in (message := driver.expect("progress", START))["progress"]:
        pass
    second = re.match(r"job (\d+)", message["progress"]).group(1)
    os.kill(driver.proc.pid, signal.SIGINT)  # the stop button
    driver.expect("interrupted", 30)
    assert slurm.job_state(second) == "CANCELLED"
    assert not any(line.startswith(f"{second} ") for line in slurm.queue())


@pytest.mark.parametrize("how,expected", [("scancel", "CANCELLED"), ("time limit", "TIMEOUT"),
                                          ("preemption", "PREEMPTED")])
def test_slurm_ending_a_worker_raises_worker_died_with_the_job_state(slurm, drivers, pids, queue_empty,
                                                                     tmp_path, how, expected):
    driver = _start(drivers, """
say(job=c.launcher.job, workers=workers(c))
while True:
    try:
        rpc.rpc_sync("worker1", time.sleep, args=(0.2,))
    except Exception as e:
        say(error=type(e).__name__, text=str(e))
        break
c.shutdown()
say(done=True)
""", n=1, slurm={"time_limit": "1"} if how == "time limit" else True)
    up = driver.expect("job", START)
    pids.add(*(w[3] for w in up["workers"]))
    job = up["job"]
    urgent = None
    if how == "scancel":
        slurm.command("scancel", job)
    elif how == "preemption":  # a job of a higher tier that needs every CPU of the node
        done = slurm.command("sbatch", "--parsable", "--partition=urgent", "--job-name=urgent",
                             f"--ntasks={minislurm.CPUS}", "--output=/dev/null", "--wrap", "sleep 600")
        assert done.returncode == 0, done.stderr
        urgent = done.stdout.strip()
    try:
        failure = driver.expect("error", 150)
        assert failure["error"] == "WorkerDiedError", failure
        assert "'worker1'" in failure["text"] and f"Slurm job {job} is {expected}" in failure["text"], failure
        driver.expect("done", 60)
        assert slurm.job_state(job) == expected
    finally:
        if urgent:
            slurm.command("scancel", urgent)


def test_in_an_allocation_workers_are_a_step_and_no_new_job(slurm, pids, queue_empty, tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(HEADER + """
c = nbrpc.start(2, bind="127.0.0.1", progress=report, slurm=True)
say(allocation=os.environ["SLURM_JOB_ID"], workers=workers(c), queue=os.popen("squeue -h -o '%i %j'").read(),
    value=rpc.rpc_sync("worker2", torch.mul, args=(torch.ones(2), 3)).tolist())
c.shutdown()
say(steps=os.popen("squeue -h -s -o '%i %j'").read())
""")
    out = tmp_path / "salloc.out"
    with open(out, "wb") as f:
        salloc = subprocess.Popen(["salloc", "--ntasks=2", "--job-name=notebook", sys.executable, str(script)],
                                  stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    pids.add(salloc.pid)
    assert salloc.wait(timeout=START) == 0, out.read_text()
    import json

    records = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    up = next(r for r in records if "allocation" in r)
    allocation = up["allocation"]
    assert up["value"] == [3.0, 3.0]
    steps = {w[2] for w in up["workers"]}
    assert len(steps) == 1 and re.fullmatch(rf"{allocation}\.\d+", steps.pop()), up["workers"]
    assert up["queue"].split() == [allocation, "notebook"]  # the allocation only: no new job
    after = next(r for r in records if "steps" in r)
    assert "nbrpc-master" not in after["steps"]


def test_no_sbatch_and_refused_options_are_usage_errors(slurm, queue_empty, ip, monkeypatch, tmp_path):
    def members():  # this process's group as it is (a driver stays a member once it joined)
        return membership.member_names() if membership.is_member() else None

    before = members()
    with pytest.raises(JobRefusedError, match=r"sbatch refused the workers' job: sbatch: error: "
                                              r"invalid partition specified: nope"):
        nbrpc.start(1, bind="127.0.0.1", progress=None, slurm={"partition": "nope"})
    # refused before the driver joined RPC for this cluster: no cluster, the group as it was
    assert nbrpc.current() is None and members() == before
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="invalid partition specified: nope"):
        ip.run_line_magic("rpc_init", "-n 1 --slurm --bind 127.0.0.1 --partition nope")
    with pytest.raises(UsageError, match="invalid partition specified: other"):
        ip.run_line_magic("rpc_init", '-n 1 --slurm --bind 127.0.0.1 --slurm-args "-p other -t 5"')
    with pytest.raises(UsageError, match=r"--partition, --time-limit are for Slurm jobs: add --slurm"):
        ip.run_line_magic("rpc_init", "--partition gpu --time-limit 30")
    assert nbrpc.current() is None and slurm.queue() == []
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match="no sbatch on the PATH"):
        nbrpc.Cluster(2, slurm=True)
    with pytest.raises(UsageError, match="no sbatch on the PATH"):
        ip.run_line_magic("rpc_init", "--slurm")


def test_job_failing_before_its_workers_join_shows_its_output(slurm, drivers, pids, queue_empty):
    driver = drivers(HEADER + """
try:
    nbrpc.start(2, bind="127.0.0.1", progress=report, slurm={"python": "/nonexistent/python"})
except nbrpc.WorkerStartError as e:
    say(error=str(e))
""")
    error = driver.expect("error", START)["error"]
    assert re.search(r"Slurm job \d+ ended \((FAILED|COMPLETED)\) before its workers joined", error), error
    assert "/nonexistent/python" in error and "Joined: none." in error, error


def test_fewer_workers_than_asked_names_who_joined_and_the_job_state(slurm, drivers, pids, queue_empty, tmp_path):
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\n[ "$SLURM_PROCID" = 1 ] && exit 7\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    driver = drivers(HEADER + f"""
try:
    nbrpc.start(2, bind="127.0.0.1", progress=report, startup_timeout=45, slurm={{"python": {str(wrapper)!r}}})
except nbrpc.WorkerStartError as e:
    say(error=str(e))
""")
    error = driver.expect("error", START)["error"]
    assert "1 of 2 workers joined" in error, error
    assert re.search(rf"Joined: worker1 \(pid \d+ on {slurm.host}, 127\.0\.0\.1\)\.", error), error
    assert re.search(r"Slurm job \d+: RUNNING on \S+; 1 of its 2 tasks have not joined\.", error), error


def test_gpus_ask_slurm_for_one_per_task_and_a_worker_that_sees_none_fails_the_start(slurm, drivers, pids,
                                                                                   queue_empty):
    """The driver has no GPU (a login node): its plan puts each worker on its own cuda:0.
    Slurm hands out this Slurm's two fake GPUs, in which torch sees none: the first
    worker's report fails the start at once, not at the start timeout."""
    driver = drivers(HEADER + """
try:
    nbrpc.start(2, bind="127.0.0.1", progress=report, gpus=True, slurm=True)
except Exception as e:
    say(error=type(e).__name__, text=str(e), t=time.monotonic())
""")
    running = driver.expect("progress", START)
    while not running["progress"].startswith("job ") or " running on " not in running["progress"]:
        running = driver.expect("progress", START)
    job = running["progress"].split()[1]
    failure = driver.expect("error", START)
    assert failure["error"] == "WorkerStartError", failure
    assert f"a worker of Slurm job {job} was refused: worker" in failure["text"], failure
    assert re.search(r"worker[12] on \S+ \(127.0.0.1\) sees no GPU \(torch.cuda.device_count\(\) there\), "
                     r"and this cluster puts it on cuda:0", failure["text"]), failure["text"]
    assert failure["t"] - running["t"] < 30, "a refused worker fails the start at once"
    assert re.search(r"TresPerTask=\S*gpu:1", slurm.command("scontrol", "show", "job", job).stdout)
    assert wait_until(lambda: not slurm.queue(), CANCELLED_WITHIN), slurm.queue()


def test_magics_in_a_notebook_status_shows_the_job_and_kernel_shutdown_cancels_it(slurm, queue_empty, tmp_path):
    notebook = execute_cells(tmp_path, [
        "%load_ext nbrpc",
        "%rpc_init -n 2 --slurm --bind 127.0.0.1 --time-limit 15 --slurm-args '--job-name=nb-magic'",
        "%rpc_status",
        "import nbrpc, torch.distributed.rpc as rpc\n"
        "print(nbrpc.current().launcher.job, rpc.rpc_sync('worker1', pow, args=(2, 5)))",
        "%rpc_shutdown",
        "%rpc_init -n 1 --slurm --bind 127.0.0.1",
        "print(nbrpc.current().launcher.job)",
    ], timeout=300)
    ended = time.monotonic()
    first, value = notebook.cells[3].outputs[0]["text"].split()
    assert value == "32"
    from conftest import cell_text

    status = cell_text(notebook.cells[2], "execute_result")
    assert status.splitlines()[0].split()[-1] == "job"
    assert [line.split()[-1] for line in status.splitlines()[2:]] == [first, first]
    assert "shut down" in cell_text(notebook.cells[4])
    second = cell_text(notebook.cells[6]).strip()
    assert slurm.job_state(first) in ("COMPLETED", "CANCELLED")
    # The kernel shut down with the second cluster running: its job ends with it.
    assert wait_until(lambda: not slurm.queue(), CANCELLED_WITHIN), slurm.queue()
    print(f"\nkernel shutdown: job {second} gone from squeue {time.monotonic() - ended:.2f} s after the kernel ended")


@pytest.mark.parametrize("how", ["restart", "SIGKILL"])
def test_kernel_restart_or_kill_cancels_the_job(slurm, queue_empty, tmp_path, how):
    kernel = UnixSocketKernelManager(kernel_name="python3")
    kernel.start_kernel(cwd=str(tmp_path))
    client = kernel.client()
    client.start_channels()
    printed = []

    def collect(message):
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])

    try:
        client.wait_for_ready(timeout=60)
        reply = client.execute_interactive(
            "%load_ext nbrpc\n%rpc_init -n 1 --slurm --bind 127.0.0.1\nimport nbrpc\n"
            "print('JOB', nbrpc.current().launcher.job)", timeout=START, output_hook=collect)
        assert reply["content"]["status"] == "ok", reply["content"]
        job = re.search(r"JOB (\d+)", "".join(printed)).group(1)
        workers = [int(p) for p in _worker_pids_of(slurm)]
        assert workers and slurm.job_state(job) == "RUNNING"  # the worker and its store relay
        began = time.monotonic()
        if how == "restart":
            kernel.restart_kernel(now=False)
        else:
            os.kill(kernel.provisioner.process.pid, signal.SIGKILL)
        assert wait_until(lambda: not any(line.startswith(f"{job} ") for line in slurm.queue()),
                          CANCELLED_WITHIN), slurm.queue()
        print(f"\nkernel {how}: job {job} gone from squeue in {time.monotonic() - began:.2f} s")
        assert not wait_gone(workers, 5)
    finally:
        client.stop_channels()
        kernel.shutdown_kernel(now=True)


def test_notebook_progress_shows_the_pending_reason(slurm, queue_empty, blocker, tmp_path):
    notebook = execute_cells(tmp_path, [
        "%load_ext nbrpc",
        "%rpc_init -n 1 --slurm --bind 127.0.0.1 --queue-timeout 4",
    ], timeout=300, allow_errors=True)
    error = next(o for o in notebook.cells[1].outputs if o.output_type == "error")
    assert error.ename == "WorkerStartError" and "still pending" in error.evalue
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    labels = [w["state"]["value"] for w in state.values() if w["model_name"] == "LabelModel"]
    assert len(labels) == 1 and re.fullmatch(r"job \d+ pending: Resources, [45] s", labels[0]), labels
