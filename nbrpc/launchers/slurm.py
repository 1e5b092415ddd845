"""Workers in a Slurm job, joining the driver as ``attach``'s do.

Parts:

- ``SlurmOptions`` (``slurm_options``): the job's options (partition, time limit,
  account, nodes, tasks per node, CPUs and GPUs per task, free ``sbatch`` arguments,
  how long to wait in the queue).
- ``SlurmLauncher``: outside an allocation, one ``sbatch`` job whose batch script
  runs ``nbrpc worker --join`` in every task through ``srun``; inside one
  (``SLURM_JOB_ID`` set: ``salloc``, a batchspawner server), one ``srun`` step of
  that allocation. It reports the queue (state, Slurm's reason) while the job
  waits, counts the start timeout from the moment the job runs, and cancels the job
  (or step) at shutdown and when a start fails.
- ``SlurmWorker``: a worker that knows its job, so its fate names the job's state
  (TIMEOUT, CANCELLED, PREEMPTED) when Slurm ends it.
- The watcher: a small stdlib-only process in its own session that cancels the job
  when the driver dies without a shutdown (SIGKILL, a crash); it reads a pipe whose
  other end only the driver holds, so it wakes at once.

The join token never reaches Slurm: it is written to a file only the user can read
(in ``~/.nbrpc/slurm``, which compute nodes see on a shared home), the batch script
reads it into the environment of ``srun``, and ``sbatch`` runs without it in its
environment; a step inside an allocation gets it through ``srun``'s environment,
which Slurm passes to the tasks and does not store.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .._util import kill_pids
from ..errors import JobRefusedError, WorkerStartError
from ..settings import TOKEN_ENV
from .attach import AttachLauncher, RemoteWorker
from .slurm_options import SlurmOptions

__all__ = ["SlurmLauncher", "SlurmOptions", "SlurmWorker"]

# States in which a job holds (or waits for) its resources; everything else has ended.
WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED")
RUNNING = ("RUNNING",)
POLL = 0.5
# Slurm shows an ending job as COMPLETING before its final state (FAILED, TIMEOUT, ...):
# seconds to wait for that one, to name it.
SETTLE_WAIT = 5.0
CANCEL_WAIT = 10.0
OUTPUT_LIMIT = 4000


@dataclass
class SlurmWorker(RemoteWorker):
    """A worker in a Slurm job: its fate names the job's state."""

    slurm: SlurmLauncher | None = field(default=None, repr=False)

    def fate(self) -> str | None:
        fate = super().fate()
        if fate is None or self.slurm is None or self.state == "stopped":
            return fate
        return f"{fate}; {self.slurm.describe_job()}"


class SlurmLauncher(AttachLauncher):
    """``expected`` workers (named by ``names``) as the tasks of a Slurm job or step."""

    # Each task sees the GPUs Slurm gave it (--gpus-per-task binds them), from cuda:0.
    own_gpus = True

    def __init__(self, expected: int, names: list[str], options: SlurmOptions, driver_name: str,
                 bind: str | None = None, port: int = 0):
        for command in ("sbatch", "srun", "squeue", "scancel"):
            if shutil.which(command) is None:
                raise ValueError(
                    f"no {command} on the PATH: run the notebook where Slurm's commands are "
                    "(a login node; 'module load slurm' on some clusters), or start workers "
                    "elsewhere with --attach N")
        super().__init__(expected, names, bind, port)
        self.options = options.checked()
        self.job_name = options.job_name or f"nbrpc-{driver_name}"
        self.python = options.python or sys.executable
        self.allocation = os.environ.get("SLURM_JOB_ID") or None
        if self.allocation and not options.job_name:
            # The watcher finds a step by its name: this kernel's, not another's in the same
            # allocation (every notebook of a batchspawner server has the driver "master").
            self.job_name += f"-{os.getpid()}"
        self.job: str | None = None  # "4321", or "4321.2" for a step of the allocation
        self.started_at: float | None = None
        self.folder: str | None = None
        self._step: subprocess.Popen | None = None
        self._watcher: subprocess.Popen | None = None
        self._watch_pipe: int | None = None
        self._state_cache: tuple[float, dict] = (0.0, {})
        self._polled = 0.0
        self._ended = False

    # -- the launcher protocol --------------------------------------------------------

    def prepare(self) -> None:
        """Ask Slurm whether it would take the job (``sbatch --test-only``) before the
        driver joins RPC, so bad options fail at once with Slurm's own message."""
        if self.allocation:
            return
        argv = self._sbatch(["--test-only", "--output=/dev/null"])
        done = _submit(argv, "#!/bin/sh\ntrue\n")
        if done.returncode != 0:
            raise JobRefusedError(_refusal(done, argv))

    def start(self, cluster, driver, deadline: float) -> None:
        """Submit the job (or step), wait while it is queued, then for its workers to join;
        the start timeout counts from the moment the job runs."""
        from .rendezvous import Rendezvous

        self.cluster, self.driver = cluster, driver
        self.server = Rendezvous(self.address, self.port, self.token, driver.store.port,
                                 self._admit, self._say)
        self._launch()
        self._wait_queue()
        self._wait(time.monotonic() + cluster.startup_timeout)

    def stop(self, workers) -> None:
        """Tell the workers to exit, then cancel the job and wait until Slurm lets it go."""
        try:
            super().stop(workers)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Cancel the job (or step) and wait up to ``CANCEL_WAIT`` s for it to leave the queue."""
        if self._ended:
            return
        self._ended = True
        if self.job is None and self._step is not None and self.allocation:
            self.job = self._find_step()
        if self.job is not None:
            _quiet(["scancel", self.job])
            deadline = time.monotonic() + CANCEL_WAIT
            while self.job_state().get("state") in (*WAITING, *RUNNING, "COMPLETING") \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
        if self._step is not None:
            kill_pids([self._step.pid])
            self._step.wait(timeout=10)
        self._stand_down_watcher()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -- submitting ----------------------------------------------------------------------

    @property
    def join_address(self) -> str:
        return f"{self.address}:{self.server.port}"

    def _launch(self) -> None:
        base = os.path.expanduser(self.options.folder or os.path.join("~", ".nbrpc", "slurm"))
        os.makedirs(base, mode=0o700, exist_ok=True)
        self.folder = tempfile.mkdtemp(prefix="job-", dir=base)  # mode 0700
        self.output = os.path.join(self.folder, "output.log")
        if self.allocation:
            self._launch_step()
        else:
            self._launch_job()
        self.cluster.progress(0, self.expected, f"Slurm job {self.job or self.allocation} submitted")

    def _worker_command(self) -> list[str]:
        return [self.python, "-m", "nbrpc.cli", "worker", "--join", self.join_address]

    def _launch_job(self) -> None:
        token_file = os.path.join(self.folder, "token")
        with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(self.token)
        script = "\n".join([
            "#!/bin/sh",
            f"# nbrpc workers joining {self.join_address}; the token stays in a file only its owner reads",
            f"{TOKEN_ENV}=$(cat {shlex.quote(token_file)}) || exit 1",
            f"export {TOKEN_ENV}",
            "exec srun --export=ALL " + " ".join(shlex.quote(a) for a in self._worker_command()),
            "",
        ])
        argv = self._sbatch(["--parsable", f"--output={self.output}", f"--chdir={self.folder}"])
        done = _submit(argv, script)
        if done.returncode != 0 or not done.stdout.strip():
            shutil.rmtree(self.folder, ignore_errors=True)
            self._ended = True
            raise JobRefusedError(_refusal(done, argv))
        self.job = done.stdout.strip().split(";")[0]
        self._start_watcher(self.job)

    def _sbatch(self, extra: list[str]) -> list[str]:
        o = self.options
        return ["sbatch", *extra, f"--job-name={self.job_name}", f"--ntasks={self.expected}",
                f"--time={o.time_limit}", *([f"--partition={o.partition}"] if o.partition else []),
                *([f"--account={o.account}"] if o.account else []), *o.resources(), *o.args]

    def _launch_step(self) -> None:
        o = self.options
        # --export=ALL: a job submitted with --export=VARS (batchspawner's) leaves srun a
        # SLURM_EXPORT_ENV that would keep the token and the workers' settings from the tasks.
        argv = ["srun", "--export=ALL", f"--job-name={self.job_name}", f"--ntasks={self.expected}", "--overlap",
                "--kill-on-bad-exit=0", *o.resources(), *o.args, *self._worker_command()]
        env = dict(os.environ, **{TOKEN_ENV: self.token})
        self._before = set(self._steps())
        with open(self.output, "wb") as out:
            self._step = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self._start_watcher(f"{self.allocation}:{self.job_name}")

    # -- the queue -----------------------------------------------------------------------

    def job_state(self, max_age: float = 0.0) -> dict:
        """``{"state", "reason", "nodes"}`` of the job (or step) from ``squeue``; ``{}`` once Slurm forgot it."""
        at, cached = self._state_cache
        if max_age and time.monotonic() - at < max_age:
            return cached
        state = {}
        if self.job is not None and "." in self.job:
            job, _ = self.job.split(".", 1)
            done = _quiet(["squeue", "-h", "-s", "-j", job, "-o", "%i|%N"])
            for line in done.stdout.splitlines():
                step, _, nodes = line.partition("|")
                if step.strip() == self.job:
                    state = {"state": "RUNNING", "reason": "None", "nodes": nodes.strip()}
            if not state:
                state = {"state": "ENDED", "reason": "None", "nodes": ""}
        elif self.job is not None:
            done = _quiet(["squeue", "-h", "-t", "all", "-j", self.job, "-o", "%T|%r|%N"])
            line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
            if line.count("|") == 2:
                s, reason, nodes = line.split("|")
                state = {"state": s.strip(), "reason": reason.strip(), "nodes": nodes.strip()}
        self._state_cache = (time.monotonic(), state)
        return state

    def describe_job(self) -> str:
        """'Slurm job 4321 is TIMEOUT' (the state as Slurm gives it), for errors."""
        # Slurm sets the final state as it starts ending the job: wait a moment for it.
        state = self._settled(self.job_state(max_age=1.0), ending=(*RUNNING, "COMPLETING"))
        what = "step" if "." in (self.job or "") else "job"
        return f"Slurm {what} {self.job} is {state.get('state', 'gone (no longer in squeue)')}"

    def _wait_queue(self) -> None:
        """Report the job while it is queued; return once it runs."""
        began = time.monotonic()
        shown = None
        while True:
            if self.allocation:
                if self._step.poll() is not None:
                    raise WorkerStartError(self._failure(
                        f"srun ended with code {self._step.returncode} before its workers joined. "
                        f"Its output:\n{self._output()}"))
                self.job = self.job or self._find_step()
                if self.job:
                    break
                state = {"state": "PENDING", "reason": "step not created yet"}
            else:
                state = self.job_state()
                if state.get("state") in RUNNING:
                    break
                if state.get("state") not in WAITING:
                    raise WorkerStartError(self._failure(self._ended_text(state)))
            waited = time.monotonic() - began
            reason = "waiting for the scheduler" if state["reason"] in ("None", "") else state["reason"]
            message = f"job {self.job or self.allocation} {state['state'].lower()}: {reason}, {waited:.0f} s"
            if message != shown:
                self.cluster.progress(0, self.expected, message)
                shown = message
            limit = self.options.queue_timeout
            if limit is not None and waited > limit:
                raise WorkerStartError(
                    f"Slurm job {self.job} still {state['state'].lower()} after {waited:.0f} s "
                    f"(queue_timeout={limit:g} s; Slurm's reason: {state['reason']}); it is cancelled. "
                    "Ask for less (fewer workers, a shorter time limit), another partition, "
                    "or wait longer (--queue-timeout, or none to wait as long as it takes).")
            time.sleep(POLL)
        self.started_at = time.monotonic()
        self.cluster.progress(0, self.expected, f"job {self.job} running on {self.job_state().get('nodes') or '?'}"
                              f" after {self.started_at - began:.1f} s in the queue")

    def _check_launched(self) -> None:
        if self.unfit:  # the job's other tasks got the same resources
            raise WorkerStartError(self._failure(f"a worker of Slurm job {self.job} was refused: {self.unfit[0]}"))
        if time.monotonic() - self._polled < 1.0:
            return
        self._polled = time.monotonic()
        state = self.job_state()
        if state.get("state") not in (*WAITING, *RUNNING):
            raise WorkerStartError(self._failure(self._ended_text(state)))

    def _settled(self, state: dict, ending: tuple[str, ...] = ("COMPLETING",)) -> dict:
        """The job's state once it is no longer one of ``ending`` (a job's, not a step's),
        or after ``SETTLE_WAIT`` seconds."""
        deadline = time.monotonic() + SETTLE_WAIT
        while state.get("state") in ending and "." not in (self.job or "") and time.monotonic() < deadline:
            time.sleep(0.2)
            state = self.job_state()
        return state

    def _ended_text(self, state: dict) -> str:
        state = self._settled(state)
        return (f"Slurm {'step' if self.allocation else 'job'} {self.job} ended "
                f"({state.get('state', 'no longer in squeue')}) before its workers joined. "
                f"Its output ({self.output}):\n{self._output()}")

    def _not_joined(self) -> list[str]:
        state = self.job_state(max_age=1.0)
        joined = sum(1 for w in self.cluster.known_workers() if w.state == "running")
        return [f"Slurm job {self.job}: {state.get('state', 'gone')} on {state.get('nodes') or 'no node'}; "
                f"{max(0, self.expected - joined)} of its {self.expected} tasks have not joined."]

    def _failure(self, what: str) -> str:
        if self.server is None:
            return what
        return super()._failure(what).replace(
            f"Start the missing workers with:\n    {self.command}\nor raise",
            "Raise")

    def _output(self) -> str:
        try:
            with open(self.output, errors="replace") as f:
                text = f.read()
        except OSError:
            return "(no output)"
        return text[-OUTPUT_LIMIT:].strip() or "(no output)"

    # -- workers -------------------------------------------------------------------------

    def _new_worker(self, name: str, hello: dict, peer: tuple) -> SlurmWorker:
        w = SlurmWorker(name, 0, host=str(hello.get("host", "?")), ip=peer[0], pid=hello.get("pid"),
                        state="joining", job=self.job, slurm=self)
        return w

    # -- steps of an allocation ------------------------------------------------------

    def _steps(self) -> list[str]:
        done = _quiet(["squeue", "-h", "-s", "-j", self.allocation, "-o", "%i|%j"])
        return [line.split("|")[0].strip() for line in done.stdout.splitlines()
                if line.partition("|")[2].strip() == self.job_name]

    def _find_step(self) -> str | None:
        new = [s for s in self._steps() if s not in self._before]
        return new[-1] if new else None

    # -- the watcher -----------------------------------------------------------------

    def _start_watcher(self, target: str) -> None:
        read, write = os.pipe()
        try:
            self._watcher = subprocess.Popen(
                [sys.executable, "-I", "-c", WATCHER, str(os.getpid()), target, self.folder],
                stdin=read, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        finally:
            os.close(read)
        self._watch_pipe = write  # not inherited by later children (close-on-exec)
        threading.Thread(target=self._watcher.wait, daemon=True, name="nbrpc-slurm-watcher").start()

    def _stand_down_watcher(self) -> None:
        if self._watch_pipe is not None:
            try:
                os.write(self._watch_pipe, b"done\n")
            except OSError:
                pass
            os.close(self._watch_pipe)
            self._watch_pipe = None
        if self._watcher is not None:
            try:
                self._watcher.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_pids([self._watcher.pid])
            self._watcher = None


def _submit(argv: list[str], script: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # the token never goes to Slurm
    try:
        return subprocess.run(argv, input=script, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, "", str(e))


def _refusal(done: subprocess.CompletedProcess, argv: list[str]) -> str:
    message = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
    return (f"sbatch refused the workers' job: {message}\n(its arguments: {shlex.join(argv[1:])}); "
            "fix the Slurm options (--slurm-args, --partition, --time-limit, --account)")


def _quiet(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 1, "", str(e))


# Cancels the job when the driver dies: EOF on stdin (the driver's end closed with its
# process) without the driver's "done" first, or the driver's pid gone. Standard
# library only, so it starts in a few milliseconds and holds no torch.
WATCHER = r"""
import os, select, shutil, subprocess, sys, time
driver, target, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def alive():
    try:
        with open(f"/proc/{driver}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
while True:
    ready = select.select([0], [], [], 1.0)[0]
    if ready:
        if os.read(0, 64):
            sys.exit(0)
        break
    if not alive():
        break
if ":" in target:
    job, name = target.split(":", 1)
    out = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i|%j"], capture_output=True, text=True).stdout
    ids = [l.split("|")[0].strip() for l in out.splitlines() if l.partition("|")[2].strip() == name]
else:
    ids = [target]
if ids:
    subprocess.run(["scancel", *ids], capture_output=True)
shutil.rmtree(folder, ignore_errors=True)
"""
