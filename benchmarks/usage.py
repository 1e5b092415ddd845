"""What a process uses, read from /proc by pid: the helpers every benchmark shares.

- ``pss_mib(pid)``: proportional set size (shared pages split among their sharers).
- ``cpu_seconds(pids)``: user and system CPU time used so far, summed.
- ``cpu_ns(pid, thread)``: CPU time of a process's threads, or of one, in nanoseconds
  (the scheduler's own count: fine enough to split a call of a few hundred microseconds).
- ``process_usage(pid)``: open descriptors, resident MiB and threads (nbrpc's own, which its
  tests read too).
- ``start_time(pid)``, ``kill_pids(pids)``: a pid's process by its start, and ending them.
- ``load()``: the machine's load averages, rounded.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil

from nbrpc._util import process_usage  # noqa: F401 (one definition, one unit)


def pss_mib(pid: int) -> float:
    """PSS of ``pid`` in MiB (``/proc/PID/smaps_rollup``); 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pids: int | list[int]) -> float:
    """User and system CPU seconds the processes have used; gone ones count 0."""
    total = 0.0
    for pid in [pids] if isinstance(pids, int) else pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def cpu_ns(pid: int, thread: int | None = None) -> int:
    """CPU time of ``pid``'s threads (or of thread ``thread``) from ``/proc/PID/task/*/schedstat``."""
    total = 0
    tasks = Path(f"/proc/{pid}/task")
    for task in ([tasks / str(thread)] if thread else tasks.iterdir()):
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            pass
    return total


def start_time(pid: int) -> float | None:
    """When ``pid`` started: with the pid, it names one process."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def kill_pids(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    alive = []
    for pid in pids:
        try:
            alive.append(psutil.Process(pid))
        except psutil.Error:
            pass
    for proc in alive:
        _quietly(proc.terminate)
        _quietly(proc.resume)  # a stopped process acts on SIGTERM only once resumed
    _gone, left = psutil.wait_procs(alive, timeout=grace)
    for proc in left:
        _quietly(proc.kill)
    psutil.wait_procs(left, timeout=5.0)


def _quietly(action) -> None:
    try:
        action()
    except psutil.Error:
        pass


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]

