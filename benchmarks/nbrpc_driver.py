"""An nbrpc driver in a plain script: ``nbrpc.start(1)``, then measures (see commands.py).

    python nbrpc_driver.py --threads 16 --timeout 60

Besides the shared measurements it takes ``latency_unwrapped`` (and
``cuda_latency_unwrapped``): the same calls through torch's own ``rpc_sync`` inside
the nbrpc cluster, which splits nbrpc's overhead into its ``rpc_sync`` wrapper's
share and the rest; and ``remote_tracking`` and ``local_rref_tracking``:
``rpc.remote`` and ``RRef(value)`` with the driver's RRef tracking on and off, taking
turns, for tracking's share; and
``recording``: the same small calls with call recording on and off in every member
(``nbrpc.trace``), for recording's cost; and ``handoff``: the same small calls served
as nbrpc serves every call (an async_execution function, handed to
a serving thread when torch's threads are scarce) and as torch would (a plain
function, on torch's RPC thread), for the serving's cost; ``handoff_forced``: the same,
every call handed to a serving thread.
"""

# nbrpc first, as in a notebook: it sets THP_MEM_ALLOC_ENABLE before torch loads.
import nbrpc  # isort: skip

import argparse
import itertools
import os
import signal
import sys
from pathlib import Path

import commands
import rpc_functions
import timing
import torch.distributed.rpc as rpc

from nbrpc import _bench

HERE = Path(__file__).resolve().parent
# Recording on and off take turns every few calls within one measurement: the machine's
# speed drifts by several percent from one stretch of calls to the next, far more than
# recording costs, and turns this short see the same machine.
RECORDING_STRIDE = 10
_recording_measurements = itertools.count()
_tracking_measurements = itertools.count()
_handoff_measurements = itertools.count()


# The "cell_*" measurements call the same code as the raw pair's importable targets,
# defined here in __main__ as a notebook cell defines it.
exec(compile(rpc_functions.CELL_SOURCE, "<cell>", "exec"), globals())
timing.CELL = {"echo": echo, "scaled": scaled}  # noqa: F821 (defined just above)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    replies = commands.claim_stdout()
    commands.exit_with_parent()
    # SIGTERM from the benchmark unwinds like an error, so nbrpc ends its worker even
    # in the middle of start().
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    cluster = nbrpc.start(1, threads=args.threads, timeout=args.timeout, transport=args.transport,
                          device_maps=None if args.device_map is None else {"worker1": {0: args.device_map}},
                          env=_worker_env(), progress=None)
    try:
        commands.serve(_measure, replies, [w.pid for w in cluster.workers])
    finally:
        cluster.shutdown()


def _measure(op: str, count: int):
    if op in ("latency_unwrapped", "cuda_latency_unwrapped"):
        return timing.measure("worker1", op.removesuffix("_unwrapped"), count, rpc_sync=_bench.torch_rpc_sync)
    if op == "remote_tracking":  # the driver's share of tracking; the worker's stays on
        timing.remote_latencies("worker1", timing.WAKE_UP_CALLS)
        return _on_and_off(_bench.rref_tracking, lambda n: timing.remote_latencies("worker1", n), count,
                           next(_tracking_measurements) % 2 == 0, True)
    if op == "local_rref_tracking":  # RRef(value): tracking's CPU alone, no message
        return _on_and_off(_bench.rref_tracking, timing.local_rref_lives, count,
                           next(_tracking_measurements) % 2 == 0, True)
    if op == "recording":
        timing.sync_latencies("worker1", timing.WAKE_UP_CALLS)
        return _on_and_off(_bench.recording,
                           lambda n: timing.sync_latencies("worker1", n), count,
                           next(_recording_measurements) % 2 == 0, False)
    if op == "cell_bytes":
        timing.measure("worker1", "cell_sync", 1)
        return {name: _bench.sent_bytes(func, "worker1") for name, func in timing.CELL.items()}
    if op in ("handoff", "handoff_forced"):
        # worker1 serves; None: its default limit, found again
        rpc.rpc_sync("worker1", _bench.set_inline_limit, args=(0 if op == "handoff_forced" else None,))
        return _served_and_plain(count)
    return timing.measure("worker1", op, count)


def _on_and_off(switch, calls, count: int, on: bool, after: bool) -> dict[str, list[float]]:
    """``count`` calls' seconds (``calls(n)`` times ``n``), half of them with ``switch(True)``
    (call recording in every member, what ``with nbrpc.trace():`` turns on without its
    snapshot; or the driver's RRef tracking), in turns of ``RECORDING_STRIDE`` calls,
    the first turn's side ``on``. Each turn begins with its switch and an untimed call;
    the switch is left at ``after``."""
    samples = {"on": [], "off": []}
    try:
        for _ in range(max(1, count // RECORDING_STRIDE)):
            switch(on)
            calls(1)
            samples["on" if on else "off"] += calls(RECORDING_STRIDE)
            on = not on
    finally:
        switch(after)
    return samples


def _served_and_plain(count: int) -> dict[str, list[float]]:
    """``count`` small calls' seconds, half of them served as nbrpc serves every call
    and half sent as a plain function, in turns of ``RECORDING_STRIDE`` calls, sent
    alike otherwise (a call id, no wait of nbrpc's)."""
    calls = {"served": _bench.stoppable_sync(plain=False), "plain": _bench.stoppable_sync(plain=True)}
    timing.sync_latencies("worker1", timing.WAKE_UP_CALLS, calls["served"])
    samples = {"served": [], "plain": []}
    side = ("served", "plain")[next(_handoff_measurements) % 2]
    for _ in range(max(1, count // RECORDING_STRIDE)):
        timing.sync_latencies("worker1", 1, calls[side])
        samples[side] += timing.sync_latencies("worker1", RECORDING_STRIDE, calls[side])
        side = "plain" if side == "served" else "served"
    return samples


def _worker_env() -> dict[str, str]:
    """Let the worker kernel import ``rpc_functions`` by reference, as this driver does."""
    paths = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=16, help="num_worker_threads")
    parser.add_argument("--timeout", type=float, default=60.0, help="rpc_timeout in seconds")
    parser.add_argument("--transport", choices=("uv", "shm"), default="uv", help="nbrpc's transport")
    parser.add_argument("--device-map", type=int, default=None, metavar="GPU",
                        help="map the driver's cuda:0 to this GPU of worker1 (CUDA tensors travel)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main()
