"""Processes the benchmark starts: RPC groups that measure on command.

Each ``Group`` is one RPC group whose first process measures on command (see
``commands.py``): a raw torch pair or an nbrpc driver with its worker kernel. While
one group measures, the others are paused with SIGSTOP: an idle TensorPipe member
busy-polls its shared-memory transport and would take CPU from the measuring one.
Every process is ended by its pid whatever happens; ``Group`` is a context manager
for that reason.

jupyter_client starts every kernel in a session of its own, and with Linux's
autogroup scheduling (``sched_autogroup_enabled``) each session gets its own share
of the CPU. So the counterpart of an nbrpc worker kernel here (the raw pair's worker,
each baseline process) gets a session of its own too, or a busy machine would
favour one side.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from usage import kill_pids, start_time

HERE = Path(__file__).resolve().parent
FAST_ALLOC = "THP_MEM_ALLOC_ENABLE"


class Group:
    """The processes of one RPC group, started from ``commands`` (the first one measures).

    Parameters
    ----------
    label
        How errors name the group.
    commands
        One argument list per process.
    env
        Environment of every process.
    timeout
        Seconds a single call may take (the group's ``rpc_timeout``).
    scratch
        A directory of the group's files, removed when it stops.
    own_session
        Indexes of the processes to start in a session of their own.
    """

    def __init__(self, label: str, commands: list[list[str]], env: dict[str, str],
                 timeout: float, scratch: str | None = None, own_session: tuple[int, ...] = ()):
        self.label, self.commands, self.env, self.timeout = label, commands, env, timeout
        self.scratch, self.own_session = scratch, own_session
        self._procs: list[subprocess.Popen] = []
        self._started_by_group: dict[int, str] = {}  # pid -> start time, against pid reuse
        self._log = None

    def __enter__(self) -> Group:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """Our children and, of the processes they started, those still the same process."""
        started = [pid for pid, began in self._started_by_group.items() if start_time(pid) == began]
        return [p.pid for p in self._procs] + started

    def start(self) -> None:
        """Launch every process; they form the group on their own (see ``wait_ready``)."""
        self._log = tempfile.TemporaryFile()
        for index, cmd in enumerate(self.commands):
            measuring = index == 0
            self._procs.append(subprocess.Popen(
                cmd, env=self.env, stderr=self._log, text=True,
                stdin=subprocess.PIPE if measuring else subprocess.DEVNULL,
                stdout=subprocess.PIPE if measuring else subprocess.DEVNULL,
                start_new_session=index in self.own_session,
            ))

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the group is up and takes commands."""
        pids = self._read_reply(timeout)["pids"]
        self._started_by_group = {pid: start_time(pid) for pid in pids}

    def measure(self, op: str, count: int):
        """What ``timing.measure(op, count)`` returns, taken inside the measuring process."""
        self._send({"op": op, "count": count})
        return self._read_reply(self.timeout * max(count, 1))["result"]

    def pause(self) -> None:
        """Freeze every process, so the group's busy-polling takes no CPU from others."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_all(signal.SIGCONT)

    def stop(self) -> None:
        """Let the group leave RPC gracefully, then end every process by pid."""
        if self._procs:
            self._quit()
            end_processes(self._procs, grace=10.0)
            kill_pids(self.pids[len(self._procs):])
            if self._procs[0].stdout:
                self._procs[0].stdout.close()
        if self._log:
            self._log.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self._procs, self._started_by_group, self._log = [], {}, None

    def _quit(self) -> None:
        """Ask the measuring process to quit and give the group time to leave RPC."""
        self.resume()
        try:
            self._send({"op": "quit"})
            self._procs[0].stdin.close()
            self._procs[0].wait(timeout=30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass  # gone or stuck: ended by pid in stop()

    def _signal_all(self, signum: int) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass  # its end shows up as a failed reply

    def _send(self, command: dict) -> None:
        self._procs[0].stdin.write(json.dumps(command) + "\n")
        self._procs[0].stdin.flush()

    def _read_reply(self, timeout: float) -> dict:
        stdout = self._procs[0].stdout
        ready, _, _ = select.select([stdout], [], [], timeout)
        line = stdout.readline() if ready else ""
        if not line:
            what = f"did not answer within {timeout:g} s" if not ready else "exited"
            raise RuntimeError(f"the {self.label} {what}. Its output:\n{self._log_tail()}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"the {self.label} failed: {reply['error']}")
        return reply

    def _log_tail(self, chars: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:] or "(no output)"


def raw_pair(fast_alloc: bool, threads: int, timeout: float, transport: str = "default",
             device_map: int | None = None) -> Group:
    """Two plain processes joined by ``rpc.init_rpc`` (see ``raw_pair.py``).

    ``fast_alloc`` starts both with ``THP_MEM_ALLOC_ENABLE=1`` (what nbrpc does);
    False leaves torch's default allocator. ``transport`` is "uv" (nbrpc's default)
    or "default" (torch's: shm, then uv). ``device_map``: the master's cuda:0 maps to
    this GPU of the worker. The worker gets a session of its own, as an nbrpc worker
    kernel does (see the module docstring).
    """
    scratch = tempfile.mkdtemp(prefix="nbrpc-bench-")
    store = os.path.join(scratch, "store")
    settings = ["--store", store, "--threads", str(threads), "--timeout", str(timeout),
                "--transport", transport, *_device_map(device_map)]
    commands = [[sys.executable, str(HERE / "raw_pair.py"), "--rank", rank, *settings]
                for rank in ("0", "1")]
    env = _environment_without_fast_alloc()
    if fast_alloc:
        env[FAST_ALLOC] = "1"
    label = f"raw torch RPC pair ({transport} transports" + ("" if fast_alloc else ", default allocator") + ")"
    return Group(label, commands, env, timeout, scratch, own_session=(1,))


def nbrpc_cluster(threads: int, timeout: float, transport: str = "uv", device_map: int | None = None) -> Group:
    """A plain script as nbrpc driver with one worker kernel; nbrpc sets its own environment.
    ``device_map`` as for ``raw_pair``."""
    command = [sys.executable, str(HERE / "nbrpc_driver.py"), "--threads", str(threads),
               "--timeout", str(timeout), "--transport", transport, *_device_map(device_map)]
    return Group(f"nbrpc cluster ({transport})", [command], _environment_without_fast_alloc(), timeout)


def _device_map(gpu: int | None) -> list[str]:
    return [] if gpu is None else ["--device-map", str(gpu)]


def _environment_without_fast_alloc() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != FAST_ALLOC}


def end_processes(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """Ask each running process to stop, then kill whatever is left after ``grace``."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused process would not act on SIGTERM
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
