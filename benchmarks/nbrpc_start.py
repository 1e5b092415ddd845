"""Time ``nbrpc.start(n)`` in a fresh process, as the first ``%rpc_init`` of a new kernel.

    python nbrpc_start.py 4    # prints {"seconds": ..., "pids": [worker pids]}

A fresh process per measurement: after its first cluster the driver stays in the
RPC group, and its idle TensorPipe member would take CPU from what runs next.
"""

import json
import sys
import time

import nbrpc


def main(argv: list[str]) -> None:
    began = time.perf_counter()
    cluster = nbrpc.start(int(argv[0]), progress=None)
    seconds = time.perf_counter() - began
    pids = [w.pid for w in cluster.workers]
    cluster.shutdown()
    print(json.dumps({"seconds": seconds, "pids": pids}))


if __name__ == "__main__":
    main(sys.argv[1:])
