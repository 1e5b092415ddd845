"""One member of a plain torch RPC pair: no nbrpc, default transports, loopback only.

    python raw_pair.py --rank 1 --port PORT    # "worker1": serves calls until shutdown
    python raw_pair.py --rank 0 --port PORT    # "master": runs the timing loops

The master prints ``{"ready": true}`` once the pair is up, then answers each JSON
command read from stdin (``{"op": "latency", "count": 500}``) with one JSON line,
until ``{"op": "quit"}`` or the end of its input. Both members then leave with a
graceful ``rpc.shutdown()``. Both exit when their parent process goes away, so an
interrupted benchmark leaves nothing running.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

NAMES = ("master", "worker1")


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    replies = _claim_stdout()
    _exit_with_parent()
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    import torch.distributed.rpc as rpc

    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=args.threads,
        rpc_timeout=args.timeout,
        init_method=f"tcp://127.0.0.1:{args.port}",
    )
    rpc.init_rpc(NAMES[args.rank], rank=args.rank, world_size=2, rpc_backend_options=options)
    if args.rank == 0:
        _serve_commands(replies)
    rpc.shutdown()


def _serve_commands(replies) -> None:
    """Answer the benchmark's commands with measurements taken from this process."""
    import timing

    _reply(replies, {"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            return
        try:
            result = timing.measure(NAMES[1], command["op"], command["count"],
                                    command.get("in_flight", 32))
            _reply(replies, {"result": result})
        except Exception as e:  # report it; the benchmark decides what to do
            _reply(replies, {"error": f"{type(e).__name__}: {e}"})


def _reply(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _claim_stdout():
    """Keep stdout for replies only; anything else printed (even by C++) goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


def _exit_with_parent() -> None:
    """End this process as soon as the benchmark that started it is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        # RPC threads would block a normal interpreter exit.
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, choices=(0, 1), required=True)
    parser.add_argument("--port", type=int, required=True, help="rendezvous port on 127.0.0.1")
    parser.add_argument("--threads", type=int, default=16, help="num_worker_threads")
    parser.add_argument("--timeout", type=float, default=60.0, help="rpc_timeout in seconds")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
