"""The user's script, and the notebook that replaces it (``user.py`` runs both).

    python user_script.py nbrpc [CALLS TRIPS]            # nbrpc.start(1): a plain script as the driver
    python user_script.py raw RANK STORE [CALLS TRIPS]   # init_rpc between two plain processes
    python user_script.py raw-uv RANK STORE [CALLS TRIPS]  # the same, told to use uv as nbrpc does
    python user_script.py nbrpc --turns                  # either way: a turn per line of stdin

The same functions, called the same way: a small ``rpc_sync`` of a function defined in
``__main__``, ``rpc.remote`` + ``to_here``, ``rpc_async`` throughput with 32 in flight and
a 100 MiB round trip, all to "worker1". The raw pair is ``rpc.init_rpc`` left at torch's
defaults (or told to use TensorPipe's ``uv`` transport only, nbrpc's default), meeting
through a file store; rank 1 serves until rank 0 is done. A notebook runs the code between
the two "cells" markers below as a cell, after ``%load_ext nbrpc`` and ``%rpc_init -n 1``.
The measuring process prints one JSON line; with ``--turns`` it reads a number N per line
instead and answers each with ``turn(N)``'s figures (``kinds_turn(N, ROW)``'s for a line
"kinds N ROW": a row of the argument-kind table), until its input ends.
"""

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["nbrpc"]:
    import nbrpc  # before torch, as ``%load_ext nbrpc`` is a notebook's first cell

# -- cells begin
import collections  # noqa: E402
import contextlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed.autograd as dist_autograd  # noqa: E402
import torch.distributed.rpc as rpc  # noqa: E402


def echo(value):
    return value


class Point:
    """A cell's class, whose instances go as arguments."""

    def __init__(self, x, y):
        self.x, self.y = x, y


class Echo:
    """What an RRef on worker1 holds, for calls through its proxy."""

    def echo(self, value):
        return value


def timed(call, n):
    samples = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples) * 1e3


def throughput(n, in_flight=32):
    pending = collections.deque()
    began = time.perf_counter()
    for _ in range(n):
        if len(pending) >= in_flight:
            pending.popleft().wait()
        pending.append(rpc.rpc_async("worker1", echo, args=(1,)))
    while pending:
        pending.popleft().wait()
    return n / (time.perf_counter() - began)


def measure_all(calls=1000, trips=3):
    """Medians: ms per small call, per remote + to_here, calls/s, ms per 100 MiB trip."""
    tensor = torch.ones(100 * 2**20 // 4)
    timed(lambda: rpc.rpc_sync("worker1", echo, args=(1,)), 100)  # connections, threads: not timed
    timed(lambda: rpc.remote("worker1", echo, args=(1,)).to_here(), 50)
    timed(lambda: rpc.rpc_sync("worker1", echo, args=(tensor,)), 1)
    return {"sync_ms": timed(lambda: rpc.rpc_sync("worker1", echo, args=(1,)), calls),
            "remote_ms": timed(lambda: rpc.remote("worker1", echo, args=(1,)).to_here(), calls // 2),
            "throughput": statistics.median(throughput(calls) for _ in range(3)),
            "tensor_ms": timed(lambda: rpc.rpc_sync("worker1", echo, args=(tensor,)), trips)}


def turn(n):
    """One turn of the side-by-side comparison: ms per small call, per remote + to_here,
    calls/s of n rpc_async with 32 in flight."""
    return {"sync_ms": timed(lambda: rpc.rpc_sync("worker1", echo, args=(1,)), n),
            "remote_ms": timed(lambda: rpc.remote("worker1", echo, args=(1,)).to_here(), n // 2),
            "throughput": throughput(n)}


# The argument kinds of ``kinds_turn``: (args, kwargs, inside a distributed autograd context).
KINDS = {"int": ((1,), {}, False),
         "tensor": ((torch.ones(4),), {}, False),
         "tensor64k": ((torch.ones(16 * 2**10),), {}, False),
         "dict": (({"weight": torch.ones(4), "bias": torch.zeros(4)},), {}, False),
         "grad": ((torch.ones(4, requires_grad=True),), {}, True),
         "kwargs": ((), {"value": 1}, False),
         "instance": ((Point(1.0, 2.0),), {}, False)}


def kinds_turn(n, row):
    """One turn of a row of the argument-kind table, ``<form>_<kind>``: ms per call of
    that form with that kind of argument, n calls."""
    form, kind = row.split("_")
    args, kwargs, in_context = KINDS[kind]
    held = rpc.remote("worker1", Echo) if form == "proxy" else None  # let go of as the turn ends
    proxy = held.rpc_sync() if held else None
    calls = {"sync": lambda: rpc.rpc_sync("worker1", echo, args=args, kwargs=kwargs),
             "async": lambda: rpc.rpc_async("worker1", echo, args=args, kwargs=kwargs).wait(),
             "remote": lambda: rpc.remote("worker1", echo, args=args, kwargs=kwargs).to_here(),
             "proxy": lambda: proxy.echo(*args, **kwargs)}
    with dist_autograd.context() if in_context else contextlib.nullcontext():
        return {row: timed(calls[form], n)}
# -- cells end


def measure(argv: list[str]) -> None:
    """Print ``measure_all``'s figures, or (``--turns``) a turn's per line of input."""
    import json

    if "--turns" not in argv:
        print(json.dumps(measure_all(*map(int, argv))), flush=True)
        return
    for line in sys.stdin:
        words = line.split()  # "N", or "kinds N ROW"
        figures = kinds_turn(int(words[1]), words[2]) if words[0] == "kinds" else turn(int(words[0]))
        print(json.dumps(figures), flush=True)


def main(argv: list[str]) -> None:
    if argv[0] == "nbrpc":
        cluster = nbrpc.start(1, progress=None)
        try:
            measure(argv[1:])
        finally:
            cluster.shutdown()
        return
    rank, store = int(argv[1]), argv[2]
    uv = {"_transports": ["uv"]} if argv[0] == "raw-uv" else {}
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{store}", **uv)
    rpc.init_rpc(("master", "worker1")[rank], rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        measure(argv[3:])
    rpc.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
