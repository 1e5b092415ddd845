"""nbrpc behind a real JupyterHub whose servers are Slurm jobs (batchspawner's SlurmSpawner).

The tests' single-node Slurm (``minislurm``) and a hub (``test_hub.Hub``) whose spawner
is batchspawner's ``SlurmSpawner``: the hub submits the student's server with ``sbatch``
as the student (``runuser``: no sudo needed), the job runs the server as a step, and
``NBRPC_LAUNCHER=slurm`` in the servers' environment makes every ``%rpc_init -n 2`` in
that server's kernels start its workers as one ``srun`` step of the student's job.
Checked: the server is the student's job; the workers are a step of it and run as the
student; killing a kernel ends its step and workers (its other clusters go on);
stopping the server from the hub ends the job, its steps and every process of it.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import minislurm
import psutil
import pytest
from conftest import Pids, wait_gone, wait_until
from test_hub import Hub, hub_unavailable, make_students, remove_homes, run_cells
from users import SYSTEM_PYTHON

pytestmark = [pytest.mark.hub, pytest.mark.slow]

STUDENT = "nbrpc-hub-slurm"
ENDED_WITHIN = 10.0
# The cmd batchspawner's wrapper runs: it finds the command on the PATH or by path and
# runs it in its own interpreter (the students' system Python, not our environment's).
SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")

# What a class's jupyterhub_config.py adds for batchspawner (docs/guide/running-a-class.md).
SLURM_SPAWNER = f"""
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.SlurmSpawner.exec_prefix = "/usr/sbin/runuser -u {{username}} --"
c.SlurmSpawner.batchspawner_singleuser_cmd = "{SYSTEM_PYTHON} -m batchspawner.singleuser"
c.Spawner.cmd = [{SINGLEUSER!r}]
c.SlurmSpawner.req_nprocs = "2"
c.SlurmSpawner.req_runtime = "30:00"
c.SlurmSpawner.startup_poll_interval = 0.5
"""

CLUSTER = [
    "%load_ext nbrpc",
    "%rpc_init -n 2",
    "import json, os, nbrpc\nimport torch.distributed.rpc as rpc\n"
    "env = lambda name: os.environ.get(name)\n"
    "print(json.dumps({'kernel': os.getpid(), 'job': env('SLURM_JOB_ID'), "
    "'workers': [w.pid for w in nbrpc.current().workers], 'steps': [w.job for w in nbrpc.current().workers], "
    "'worker_uids': [rpc.rpc_sync(n, os.getuid) for n in ('worker1', 'worker2')], "
    "'worker_jobs': [rpc.rpc_sync(n, env, args=('SLURM_JOB_ID',)) for n in ('worker1', 'worker2')], "
    "'worker_steps': [rpc.rpc_sync(n, env, args=('SLURM_STEP_ID',)) for n in ('worker1', 'worker2')], "
    "'sum': sum(rpc.rpc_sync(n, pow, args=(2, 3)) for n in ('worker1', 'worker2'))}))",
]


class ClassOnSlurm:
    """The running Slurm, the hub, and the student's server (its job and a token)."""

    def __init__(self, slurm: minislurm.MiniSlurm, hub: Hub, pids: Pids):
        self.slurm, self.hub, self.pids = slurm, hub, pids
        self.uid = pwd.getpwnam(STUDENT).pw_uid
        self.token = hub.start_server(STUDENT)
        self.job = _job_of(slurm, STUDENT)
        self.server = _server_pid(self.uid)
        pids.add(self.server)

    def cluster(self) -> dict:
        """A new kernel of the student's with ``%rpc_init -n 2`` run in it: what it saw."""
        status, made = self.hub.api("POST", f"/user/{STUDENT}/api/kernels", {"name": "nbrpc"}, token=self.token)
        assert status == 201, made
        url = f"ws://127.0.0.1:{self.hub.port}/user/{STUDENT}/api/kernels/{made['id']}/channels"
        results = asyncio.run(run_cells(url, self.token, CLUSTER))
        assert [r["status"] for r in results] == ["ok"] * 3, (results, self.slurm.log("slurmctld"))
        seen = json.loads(results[2]["out"].strip().splitlines()[-1])
        self.pids.add(seen["kernel"], *seen["workers"])
        return {**seen, "url": url}

    def steps(self) -> dict[str, str]:
        """The job's steps now: ``{"4.1": "USER NAME"}``."""
        done = self.slurm.command("squeue", "-h", "--steps", "-j", self.job, "-o", "%i %u %j")
        return {line.split()[0]: " ".join(line.split()[1:]) for line in done.stdout.splitlines() if line.strip()}


def _job_of(slurm: minislurm.MiniSlurm, user: str) -> str:
    jobs = [line.split() for line in slurm.command("squeue", "-h", "-o", "%i %u %T %j").stdout.splitlines()]
    mine = [job for job, owner, state, _ in jobs if owner == user and state == "RUNNING"]
    assert len(mine) == 1, jobs
    return mine[0]


def _server_pid(uid: int) -> int:
    found = [p.pid for p in psutil.process_iter(["cmdline", "uids"])
             if p.info["uids"] and p.info["uids"].real == uid
             and (p.info["cmdline"] or [])[:3] == [SYSTEM_PYTHON, "-m", "batchspawner.singleuser"]]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture(scope="module")
def on_slurm():
    """Slurm, the hub and the student's server for this module; every process ended by pid after it."""
    why = hub_unavailable() or minislurm.unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the batchspawner tests: {why}")
        pytest.skip(why)
    make_students([STUDENT])
    # Outside pytest's folders, which only we can enter: the student reads slurm.conf and munge's socket.
    folder = Path(tempfile.mkdtemp(prefix="hub-slurm-"))
    folder.chmod(0o755)
    slurm = minislurm.MiniSlurm(folder / "slurm")
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = slurm.conf
    pids, hub, queue = Pids(), None, []
    try:
        (folder / "slurm").mkdir()
        slurm.start()
        hub = Hub(folder / "hub", pids, students=[STUDENT], extra_config=SLURM_SPAWNER,
                  environment={"SLURM_CONF": slurm.conf, "NBRPC_LAUNCHER": "slurm"})
        yield ClassOnSlurm(slurm, hub, pids)
    finally:
        if hub is not None:
            hub.close()
        if "slurmctld" in slurm.processes:
            queue = slurm.queue()
        survivors = slurm.stop() + pids.end()
        daemons = [p.pid for p in slurm.processes.values() if p.poll() is None]
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        shutil.rmtree(folder, ignore_errors=True)
        remove_homes([STUDENT])
        assert not survivors and not daemons, f"processes survived: {survivors + daemons}"
        assert not queue, f"jobs left in squeue: {queue}"


@pytest.fixture(scope="module")
def first(on_slurm):
    """The student's first cluster, in a kernel of the server's (kept running)."""
    return on_slurm.cluster()


def test_the_server_is_a_slurm_job_of_the_student(on_slurm):
    owner = on_slurm.slurm.command("squeue", "-h", "-j", on_slurm.job, "-o", "%u %T %j").stdout.split()
    assert owner == [STUDENT, "RUNNING", "spawner-jupyterhub"]
    server = psutil.Process(on_slurm.server)
    assert server.uids().real == on_slurm.uid
    assert server.environ()["SLURM_JOB_ID"] == on_slurm.job
    # The hub's own record: the spawner's state carries the job.
    status, user = on_slurm.hub.api("GET", f"/hub/api/users/{STUDENT}")
    assert status == 200 and user["servers"][""]["ready"], user


def test_rpc_init_runs_the_workers_as_an_srun_step_of_the_students_job(on_slurm, first):
    assert first["job"] == on_slurm.job
    assert first["sum"] == 16
    assert first["worker_uids"] == [on_slurm.uid] * 2
    assert first["worker_jobs"] == [on_slurm.job] * 2
    step = first["steps"][0]
    assert first["steps"] == [step, step] and re.fullmatch(rf"{on_slurm.job}\.\d+", step), first
    assert first["worker_steps"] == [step.split(".")[1]] * 2
    assert on_slurm.steps()[step] == f"{STUDENT} nbrpc-master-{first['kernel']}"
    assert {psutil.Process(p).uids().real for p in [first["kernel"], *first["workers"]]} == {on_slurm.uid}
    # One job: the workers asked Slurm for no job of their own.
    assert [line.split()[0] for line in on_slurm.slurm.queue()] == [on_slurm.job]


def test_killing_a_kernel_ends_its_workers_and_its_step(on_slurm, first):
    doomed = on_slurm.cluster()
    assert doomed["steps"][0] != first["steps"][0] and doomed["steps"][0] in on_slurm.steps()
    os.kill(doomed["kernel"], signal.SIGKILL)
    killed = time.monotonic()
    assert not wait_gone(doomed["workers"], timeout=ENDED_WITHIN), "the dead kernel's workers still run"
    assert wait_until(lambda: doomed["steps"][0] not in on_slurm.steps(), ENDED_WITHIN - (time.monotonic() - killed)), \
        on_slurm.steps()
    # The other kernel's cluster, its step and the server go on.
    assert first["steps"][0] in on_slurm.steps() and all(psutil.pid_exists(p) for p in first["workers"])
    call = "print(sum(rpc.rpc_sync(n, pow, args=(2, 3)) for n in ('worker1', 'worker2')))"
    assert asyncio.run(run_cells(first["url"], on_slurm.token, [call])) == [{"out": "16\n", "status": "ok"}]


def test_stopping_the_server_from_the_hub_ends_the_job_its_steps_and_every_worker(on_slurm, first):
    everyone = [on_slurm.server, first["kernel"], *first["workers"]]
    assert all(psutil.pid_exists(p) for p in everyone)
    stopped = time.monotonic()  # the hub answers once batchspawner saw the job leave (or 202 sooner)
    status, _ = on_slurm.hub.api("DELETE", f"/hub/api/users/{STUDENT}/server")
    assert status in (202, 204)
    assert not wait_gone(everyone, timeout=ENDED_WITHIN), "processes of the stopped server still run"
    assert wait_until(lambda: not on_slurm.slurm.queue(), ENDED_WITHIN - (time.monotonic() - stopped)), \
        on_slurm.slurm.queue()
    assert not on_slurm.steps()
    # Ended means not running: a zombie whose parent ended waits for init (pid 1) to reap it.
    left = {p.pid: p.info["cmdline"] for p in psutil.process_iter(["uids", "status", "cmdline"])
            if p.info["uids"] and p.info["uids"].real == on_slurm.uid and p.info["status"] != psutil.STATUS_ZOMBIE}
    assert not left, f"the student's processes after {time.monotonic() - stopped:.1f} s: {left}"
