"""Python bytecodes per call on the driver's main thread, by module and function: the
count that wall time hides on a busy machine (see README.md, "Where the cost goes").

    python benchmarks/bytecodes.py [--calls 200] [--loops NAMES] [--raw] [--worker] [--top 25] [--lines QUALNAME]

Runs the loops of ``parts.py`` in a one-worker cluster, calling a function of
``__main__`` (``--raw``: between two plain processes under ``init_rpc``, the function
importable on both sides) with a trace
(``sys.settrace``, ``f_trace_opcodes``) on the main thread only, after a warm-up, and
prints the bytecodes per call of each loop, split by the module that ran them (nbrpc's
by subpackage and module, torch's as one, the rest as "other") and the costliest
functions (``--worker``: on the worker's threads that serve the calls instead, the trace
set on each as its first call begins, ``WorkerCounter``). The trace slows everything
tenfold: counts, not times, are the result.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading

import parts
import torch
import torch.distributed.rpc as rpc

import nbrpc

NBRPC = os.path.dirname(os.path.abspath(nbrpc.__file__)) + os.sep
TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def echo(value):
    """The function called: defined in ``__main__``, as a notebook's or a script's, where
    nbrpc sends it by value once and by identity after (raw torch: ``parts.echo``, importable)."""
    return value


class Point:
    """The cell class whose instance ``parts.instance_calls`` sends (raw torch: ``parts.Point``)."""

    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y


def _where(code) -> str:
    name = code.co_filename
    if name.startswith(NBRPC):
        return "nbrpc/" + name[len(NBRPC):].removesuffix(".py")
    if name.startswith(TORCH):
        return "torch"
    return "other"


class Counter:
    """Bytecodes per (module, function) while on; the trace function is set per frame."""

    def __init__(self, lines: str | None = None) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.lines = lines  # a function's qualified name: its counts by line instead

    def _frame(self, frame, event, arg):
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = (_where(code), code.co_qualname)
        counts = self.counts
        by_line = code.co_qualname == self.lines

        def local(frame, event, arg):
            if event == "opcode":
                counts[(key[0], f"{key[1]}:{frame.f_lineno}") if by_line else key] += 1
            return local

        return local

    def __enter__(self):
        sys.settrace(self._frame)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


class WorkerCounter(Counter):
    """A ``Counter`` on each thread that serves a call (``on_call``, a hook of nbrpc's
    ``serving.ON_CALL``: torch's threads are made in C++), counting while ``on``."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.threads: set[int] = set()

    def _frame(self, frame, event, arg):
        return super()._frame(frame, event, arg) if self.on else None

    def on_call(self) -> None:
        if threading.get_ident() not in self.threads:
            self.threads.add(threading.get_ident())
            sys.settrace(self._frame)


# Run on the worker (``--worker``): its counter, hooked to the calls it serves.
WORKER_SETUP = """
import sys
sys.path.insert(0, {here!r})
import bytecodes as _bytecodes
from nbrpc.calls import serving as _serving
WORKER_COUNTER = _bytecodes.WorkerCounter()
_hook = _serving.ON_CALL.add(WORKER_COUNTER.on_call)
"""
WORKER_SAVE = """
WORKER_COUNTER.on = False
import json as _json
with open({path!r}, "w") as _out:
    _json.dump([[*key, n] for key, n in WORKER_COUNTER.counts.items() if key[1] != "WorkerCounter.on_call"], _out)
"""


def count_worker(cluster, loop, calls: int) -> collections.Counter:
    """``count``'s figures for the worker's threads while ``loop`` runs."""
    cluster.run("WORKER_COUNTER.counts.clear(); WORKER_COUNTER.on = True")
    loop(calls)
    with tempfile.NamedTemporaryFile(suffix=".json") as saved:
        cluster.run(WORKER_SAVE.format(path=saved.name))
        found = json.load(saved)
    return collections.Counter({(module, func): n / calls for module, func, n in found})


def count(loop, calls: int, lines: str | None = None) -> collections.Counter:
    with Counter(lines) as counter:
        loop(calls)
    counter.counts.pop(("other", "count"), None)
    return collections.Counter({key: n / calls for key, n in counter.counts.items()})


def report(name: str, counts: collections.Counter, top: int) -> str:
    by_module = collections.Counter()
    for (module, _), n in counts.items():
        by_module[module] += n
    lines = [f"\n{name}: {sum(counts.values()):.0f} bytecodes a call"]
    lines += [f"  {n:7.0f}  {module}" for module, n in by_module.most_common()]
    lines.append("  costliest functions:")
    lines += [f"  {n:7.0f}  {module}:{func}" for (module, func), n in counts.most_common(top)]
    return "\n".join(lines)


def _loops(names: str | None) -> dict:
    loops = {name: run for name, (run, _) in parts.LOOPS.items()}
    if names:
        loops = {name: loops[name] for name in names.split(",")}
    return loops


def _raw_worker(port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc(parts.WORKER, rank=1, world_size=2,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(_transports=["uv"]))
    rpc.shutdown()


def _run_raw(loops: dict, calls: int, top: int) -> None:
    import multiprocessing

    from nbrpc._util import unused_loopback_port

    port = unused_loopback_port()
    worker = multiprocessing.get_context("spawn").Process(target=_raw_worker, args=(port,))
    worker.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc("driver", rank=0, world_size=2,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(_transports=["uv"]))
    try:
        _count_all(loops, calls, top)
    finally:
        rpc.shutdown()
        worker.join()


def _count_all(loops: dict, calls: int, top: int, lines: str | None = None, worker=None) -> None:
    """Each loop's counts on the driver's main thread, or on the worker's (``worker``: the cluster)."""
    if worker is not None:
        worker.run(WORKER_SETUP.format(here=os.path.dirname(os.path.abspath(__file__))))
    for run in loops.values():
        run(200)  # connections, threads, the function's first send
    for name, run in loops.items():
        counts = count(run, calls, lines) if worker is None else count_worker(worker, run, calls)
        print(report(name if worker is None else f"{name}, on the worker", counts, top), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--loops", help="only these loops (parts.py's names), comma separated")
    parser.add_argument("--raw", action="store_true", help="raw torch between two plain processes")
    parser.add_argument("--worker", action="store_true", help="count on the worker's threads that serve the calls")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--lines", metavar="QUALNAME", help="this function's bytecodes by line")
    args = parser.parse_args()
    loops = _loops(args.loops)
    if args.raw:
        _run_raw(loops, args.calls, args.top)
        return 0
    parts.echo = echo  # the loops call the function of __main__, with its class's instance
    parts.INSTANCES[0] = Point(1.0, 2.0)
    cluster = nbrpc.start(1, progress=None)
    try:
        _count_all(loops, args.calls, args.top, args.lines, cluster if args.worker else None)
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
