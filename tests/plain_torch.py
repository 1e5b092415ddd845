"""A plain script under raw torch: each rank its own process calling ``init_rpc``, as a
script's user runs it; what the tests compare nbrpc's behaviour with. It joins on uv,
nbrpc's transport: torch's default adds shm, whose pollers spin a core per process for as
long as the group lives (on the test machine's 2 cores, they starved the tests beside)."""

from __future__ import annotations

import subprocess
import sys

from conftest import DRIVER_START, free_port

# How every rank of the script joins: rank, port and the names come from its arguments.
JOIN = '''
import sys
import torch.distributed.rpc as rpc
RANK, NAMES = int(sys.argv[1]), sys.argv[3].split(",")
_options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rpc_timeout=60,
                                           _transports=["uv"])
rpc.init_rpc(NAMES[RANK], rank=RANK, world_size=len(NAMES), rpc_backend_options=_options)
'''


def run_ranks(folder, pids, source: str, names=("master", "worker1", "worker2"), args=(),
              exits: dict | None = None) -> list[str]:
    """Run ``source`` (which joins with ``JOIN`` and reads ``RANK``) as one process per
    name, each as ``__main__`` of the same file; the stdout of each, by rank. Each must
    exit with 0, or the status ``exits`` gives for its rank."""
    path = folder / "plain_script.py"
    path.write_text(source)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(path), str(rank), port, ",".join(names), *args],
                              cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
             for rank in range(len(names))]
    pids.add(*(p.pid for p in procs))
    outs = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=DRIVER_START)
        except subprocess.TimeoutExpired:
            pids.end()
            raise
        assert proc.returncode == (exits or {}).get(rank, 0), err[-3000:]
        outs.append(out)
    return outs
