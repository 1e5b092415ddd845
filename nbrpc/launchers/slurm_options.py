"""What a Slurm job of workers asks for: ``%rpc_init --slurm`` flags, ``nbrpc.start(slurm=...)``."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields

from .options import RemoteOptions, option


@dataclass
class SlurmOptions:
    """What the workers' job asks Slurm for (``%rpc_init --slurm`` flags, ``nbrpc.start(slurm=...)``).

    ``time_limit`` is Slurm's ``--time`` (``"30"`` minutes, ``"2:00:00"``); ``args`` are
    further ``sbatch`` arguments (``"-p gpu --gres=gpu:1"``), given last so they win;
    ``queue_timeout`` is how long the job may wait in the queue (None: as long as it
    takes; interrupting the start cancels it); ``folder`` holds each job's token and
    output and must be visible to the compute nodes (default ``~/.nbrpc/slurm``).
    """

    partition: str | None = option(None, "Slurm partition (--slurm)")
    time_limit: str = option("1:00:00", "the job's time limit, as sbatch --time: 30 (minutes), 2:00:00 "
                             "(--slurm; default 1:00:00)", metavar="TIME")
    account: str | None = option(None, "Slurm account to charge (--slurm)")
    nodes: int | None = option(None, "Slurm nodes for the job (--slurm)", type=int)
    tasks_per_node: int | None = option(None, "workers per node (--slurm)", type=int)
    cpus_per_task: int | None = option(None, "CPUs per worker (--slurm)", type=int)
    gpus_per_task: int | None = option(None, "GPUs per worker (--slurm)", type=int)
    args: str | list[str] = option(None, 'further sbatch (or srun) arguments for --slurm, e.g. "-p gpu -t 30 '
                                   '--gres=gpu:1"', flag="--slurm-args", metavar="ARGS", factory=list)
    job_name: str | None = None
    queue_timeout: float | None = option(None, "cancel the job if it waits longer in the queue (--slurm; default: "
                                         "wait, the stop button cancels it)", type=float, metavar="SECONDS")
    python: str | None = None
    folder: str | None = None

    @classmethod
    def from_value(cls, value) -> SlurmOptions | None:
        """``True``, a dict of options, or ``SlurmOptions``; ``None``/``False``: no Slurm."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown Slurm option{'s' * (len(unknown) > 1)} {', '.join(unknown)}; "
                                 f"the options are {', '.join(sorted(known))}")
            return cls(**value)
        raise ValueError(f"slurm must be True, a dict of options or nbrpc.SlurmOptions, got {value!r}")

    def checked(self) -> SlurmOptions:
        for label in ("nodes", "tasks_per_node", "cpus_per_task", "gpus_per_task"):
            value = getattr(self, label)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"slurm {label} must be a whole number >= 1, got {value!r}")
        if self.queue_timeout is not None and not self.queue_timeout > 0:
            raise ValueError(f"queue_timeout must be a positive number of seconds or None, got {self.queue_timeout!r}")
        if isinstance(self.args, str):
            self.args = shlex.split(self.args)
        self.args = [str(a) for a in self.args]
        return self

    def resources(self) -> list[str]:
        """The resource flags both ``sbatch`` and ``srun`` take."""
        flags = []
        for flag, value in (("--nodes", self.nodes), ("--ntasks-per-node", self.tasks_per_node),
                            ("--cpus-per-task", self.cpus_per_task), ("--gpus-per-task", self.gpus_per_task)):
            if value is not None:
                flags.append(f"{flag}={value}")
        return flags


@dataclass
class SlurmJob(RemoteOptions):
    """The ``slurm`` launcher's options: the job's (``slurm``), where the driver listens
    (``bind``, ``port``) and the workers' interpreter (``python``)."""

    slurm: SlurmOptions | dict | bool | None = option(
        None, "start the workers as the tasks of a Slurm job (sbatch + srun), or as a step "
        "of the current allocation when SLURM_JOB_ID is set", action="store_true")
    python: str | None = None

    def __post_init__(self):
        super().__post_init__()
        self.slurm = SlurmOptions.from_value(self.slurm)
