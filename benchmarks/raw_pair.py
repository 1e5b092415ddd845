"""One member of a plain torch RPC pair: no nbrpc, default transports, loopback only.

    python raw_pair.py --rank 1 --store FILE    # "worker1": serves calls until shutdown
    python raw_pair.py --rank 0 --store FILE    # "master": measures (see commands.py)
    ... --device-map 0                          # the master's cuda:0 -> worker1's cuda:0

The pair meets through a ``file://`` store, so nothing listens but TensorPipe (on
``lo``): a ``tcp://`` store would listen on every interface, and a port chosen in
advance could be taken by another process before the store binds it. Both leave
with a graceful ``rpc.shutdown()`` once the master is told to quit.
"""

from __future__ import annotations

import argparse
import os

import commands

NAMES = ("master", "worker1")


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    replies = commands.claim_stdout()
    commands.exit_with_parent()
    os.environ["TP_SOCKET_IFNAME"] = "lo"  # TensorPipe listens on loopback only
    import timing
    import torch.distributed.rpc as rpc

    options = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=args.threads,
        rpc_timeout=args.timeout,
        init_method=f"file://{args.store}",
        **({"_transports": ["uv"]} if args.transport == "uv" else {}),
        # The recipe's way: the caller maps its cuda:0; torch derives the callee's devices.
        **({"device_maps": {NAMES[1]: {0: args.device_map}}} if args.device_map is not None and args.rank == 0
           else {}),
    )
    rpc.init_rpc(NAMES[args.rank], rank=args.rank, world_size=2, rpc_backend_options=options)
    if args.rank == 0:
        commands.serve(lambda op, count: timing.measure(NAMES[1], op, count), replies, [])
    rpc.shutdown()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, choices=(0, 1), required=True)
    parser.add_argument("--store", required=True, help="rendezvous file (must not exist yet)")
    parser.add_argument("--transport", choices=("uv", "default"), default="default",
                        help="TensorPipe transports: uv only, or torch's default (shm, uv)")
    parser.add_argument("--threads", type=int, default=16, help="num_worker_threads")
    parser.add_argument("--timeout", type=float, default=60.0, help="rpc_timeout in seconds")
    parser.add_argument("--device-map", type=int, default=None, metavar="GPU",
                        help="map the master's cuda:0 to this GPU of worker1 (CUDA tensors travel)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
