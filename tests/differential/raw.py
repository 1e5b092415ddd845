"""The raw torch side: three plain processes (master, worker1, worker2) that join with
``init_rpc`` and import ``differential.scenarios``, as upstream scripts import their
functions. master reads one JSON request a line on its stdin and answers each with
``scenarios.run``'s facts, one JSON line on its stdout. They join on uv, as nbrpc's members
do: torch's default adds shm, whose pollers spin a core per process while the group lives.

``python raw.py RANK PORT`` is one process; ``RawTorch`` starts the three and asks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from nbrpc._util import kill_pids

TESTS = Path(__file__).resolve().parent.parent
NAMES = ["master", "worker1", "worker2"]


def member(rank: int, port: int) -> None:
    """One process of the group; rank 0 serves requests until its stdin closes."""
    sys.path.insert(0, str(TESTS))
    import torch.distributed.rpc as rpc

    from differential import scenarios

    # What the scenarios print must not mix with the answers.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60,
                                              init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"])
    rpc.init_rpc(NAMES[rank], rank=rank, world_size=len(NAMES), rpc_backend_options=options)
    if rank == 0:
        answers.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            answers.write(json.dumps(scenarios.answer(json.loads(line))) + "\n")
    rpc.shutdown()


class RawTorch:
    """The three raw torch processes; ``ask(request)`` gives master's answer. They start
    in the background (the nbrpc cluster starts meanwhile); the first ``ask`` waits."""

    def __init__(self, port: int, start_timeout: float = 120.0):
        self.procs = []
        for rank in range(len(NAMES)):
            self.procs.append(subprocess.Popen(
                [sys.executable, __file__, str(rank), str(port)], cwd=TESTS, text=True,
                stdin=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                start_new_session=True))
        self.start_timeout = start_timeout
        self.ready = False  # master says so once the group is up (asked at the first request)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def read(self, timeout: float) -> dict:
        """master's next answer (a thread reads, so that a stuck or ended master fails the test)."""
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.procs[0].stdout.readline()), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        while reader.is_alive() and time.monotonic() < deadline and self.procs[0].poll() is None:
            reader.join(0.05)
        reader.join(0.5)
        if not found or not found[0]:
            codes = [p.poll() for p in self.procs]
            raise RuntimeError(f"the raw torch master gave no answer within {timeout} s "
                               f"(exit codes {codes}; its stderr is the test's)")
        return json.loads(found[0])

    def ask(self, request: dict, timeout: float = 60.0) -> dict:
        if not self.ready:
            self.ready = self.read(self.start_timeout)["ready"]
        self.procs[0].stdin.write(json.dumps(request) + "\n")
        self.procs[0].stdin.flush()
        return self.read(timeout)

    def close(self, timeout: float = 60.0) -> list[int]:
        """End the group gracefully (master's stdin closes), then by signal what still runs;
        the pids alive after that."""
        if not self.procs[0].stdin.closed:
            self.procs[0].stdin.close()
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        kill_pids([p.pid for p in self.procs if p.poll() is None])
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.procs[0].stdout.close()
        return [p.pid for p in self.procs if p.poll() is None]


if __name__ == "__main__":
    member(int(sys.argv[1]), int(sys.argv[2]))
