"""A real single-node Slurm in a temporary folder, for the Slurm launcher's tests.

``munged`` (its own key and socket), ``slurmctld`` and ``slurmd`` run in the
foreground as children of the test process, with every path (configuration, state,
spool, logs, pid files) under one folder and their ports picked free on loopback.
``SLURM_CONF`` in the environment points Slurm's commands (``sbatch``, ``srun``,
``squeue``, ``scancel``, ``scontrol``) at it; jobs inherit it. ``stop`` cancels every
job, waits for the queue to empty, and ends each daemon, and each ``slurmstepd``
this Slurm started, by pid.

It needs root (``SlurmUser=root``, ``munged --force``) and Debian's ``slurm-wlm`` and
``munge`` (``.ci/system-packages.sh`` installs them); ``unavailable()`` says why not.
In a container without systemd or cgroups the settings below keep slurmd to plain
process tracking, and the node declares more CPUs than the machine has
(``config_overrides``) so that a few single-CPU tasks fit on two cores. A second
partition of a higher priority tier preempts the default one (``PreemptMode=CANCEL``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from conftest import find_processes, free_port

from nbrpc._util import kill_pids, pid_alive

CPUS = 8
# Two "GPUs" whose device files are /dev/null and /dev/zero: Slurm hands them out (and sets
# CUDA_VISIBLE_DEVICES), torch sees none.
FAKE_GPU_FILES = "/dev/null,/dev/zero"
GPUS = 2
DAEMONS = ("munged", "slurmctld", "slurmd")
# A job in "urgent" preempts (cancels) jobs in "debug", the default, that hold what it needs.
PARTITIONS = ("debug", "urgent")

CONF = """\
ClusterName=nbrpctest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes={host} MaxTime=INFINITE State=UP PriorityTier=10
"""


def unavailable() -> str | None:
    """Why a real Slurm cannot run here, or None."""
    if os.geteuid() != 0:
        return "a real Slurm needs root (SlurmUser=root, munged --force); run the Slurm tests as root"
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    missing += [c for c in ("sbatch", "srun", "squeue", "scancel", "scontrol") if shutil.which(c) is None]
    if missing:
        return (f"Slurm is not installed ({', '.join(missing)} missing): "
                "apt-get install slurm-wlm munge (.ci/system-packages.sh does)")
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class MiniSlurm:
    """munged + slurmctld + slurmd for this machine, state under ``folder``."""

    def __init__(self, folder: str):
        self.folder = str(folder)
        self.host = socket.gethostname()
        self.conf = os.path.join(self.folder, "slurm.conf")
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self, timeout: float = 60.0) -> MiniSlurm:
        f = self.folder
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(f, sub), mode=0o700, exist_ok=True)
        os.chmod(f, 0o755)  # munged refuses a socket folder others may write to
        with open(self.conf, "w") as out:
            out.write(CONF.format(host=self.host, folder=f, cpus=CPUS, gpus=GPUS,
                                  ctld_port=free_port(), slurmd_port=free_port()))
        with open(os.path.join(f, "gres.conf"), "w") as out:
            out.write(f"AutoDetect=off\nNodeName={self.host} Name=gpu File={FAKE_GPU_FILES}\n")
        key = os.path.join(f, "munge.key")
        with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            out.write(os.urandom(1024))
        self._run("munged", [_daemon("munged"), "--foreground", "--force", f"--socket={f}/munge.sock",
                             f"--key-file={key}", f"--pid-file={f}/munged.pid", f"--log-file={f}/munged.log",
                             f"--seed-file={f}/munged.seed"])
        self._wait(lambda: os.path.exists(f"{f}/munge.sock"), timeout, "munged to open its socket")
        self._run("slurmctld", [_daemon("slurmctld"), "-D", "-i", "-f", self.conf])
        self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), timeout, "slurmctld to answer")
        self._run("slurmd", [_daemon("slurmd"), "-D", "-f", self.conf, "-N", self.host])
        self._wait(lambda: self._ok(["sinfo", "-h", "-o", "%t"], "idle"), timeout, "the node to be idle")
        return self

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def queue(self) -> list[str]:
        """``squeue``'s lines for every job still pending, running or ending: 'ID STATE NAME'."""
        done = self.command("squeue", "-h", "-o", "%i %T %j")
        return [line for line in done.stdout.splitlines() if line.strip()]

    def job_state(self, job: str) -> str:
        done = self.command("squeue", "-h", "-t", "all", "-j", str(job), "-o", "%T")
        return done.stdout.strip()

    def stop(self) -> list[int]:
        """Cancel every job, end every daemon and step daemon; return the pids that survived."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            for partition in PARTITIONS:
                self.command("scancel", "--full", "--quiet", f"--partition={partition}")
            deadline = time.monotonic() + 30
            while self.queue() and time.monotonic() < deadline:
                time.sleep(0.2)
        stepds = self.stepd_pids()
        for name in reversed(DAEMONS):
            process = self.processes.pop(name, None)
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        kill_pids(stepds)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) for p in stepds) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [p for p in stepds if pid_alive(p)]

    def stepd_pids(self) -> list[int]:
        """slurmstepd processes of this Slurm (they carry its configuration's path)."""
        return sorted(find_processes("slurmstepd", f"SLURM_CONF={self.conf}"))

    def log(self, name: str, limit: int = 3000) -> str:
        try:
            with open(os.path.join(self.folder, f"{name}.log")) as f:
                return f.read()[-limit:]
        except OSError:
            return "(no log)"

    def _run(self, name: str, argv: list[str]) -> None:
        out = open(os.path.join(self.folder, f"{name}.out"), "wb")
        self.processes[name] = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        out.close()

    def _ok(self, argv: list[str], expected: str) -> bool:
        try:
            return expected in self.command(*argv, timeout=10).stdout
        except subprocess.TimeoutExpired:
            return False

    def _wait(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {process.returncode} while waiting for {what}:\n"
                                       f"{self._output(name)}\n{self.log(name)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}:\n" + "\n".join(
                    f"--- {n}\n{self._output(n)}\n{self.log(n)}" for n in self.processes))
            time.sleep(0.2)

    def _output(self, name: str) -> str:
        try:
            with open(os.path.join(self.folder, f"{name}.out")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""


if __name__ == "__main__":  # bring one up by hand: python tests/minislurm.py FOLDER
    import sys

    slurm = MiniSlurm(sys.argv[1]).start()
    print(f"export SLURM_CONF={slurm.conf}", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        print("survivors:", slurm.stop())
