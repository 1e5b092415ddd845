"""Where a small ``rpc_sync`` spends its time, phase by phase, for each kind of argument:
nbrpc against raw torch, one after the other in one run (part of ``make bench-parts``).

    python benchmarks/phases.py [--rounds 40] [--calls 20]

Each side calls ``echo`` on "worker1" with each kind of argument of the user's
comparison (``user_script.KINDS``: an int, tensors, a dict, a keyword, a cell class's
instance...), ``--calls`` calls of each kind in turn for ``--rounds`` rounds. torch's
``_InternalRPCPickler.serialize`` and ``deserialize`` (nbrpc's where it installed its own)
note when they begin and end, on the driver and on the worker; the clock is the system's
monotonic one, which both processes read alike, so a call splits into: the driver's
wrappers, its pickling of the call, the message reaching the worker, the worker's
unpickling, running and pickling of the reply, the reply reaching the driver, the
driver's unpickling and return. Prints each phase's median per kind, nbrpc's beside raw
torch's, in microseconds, and the whole call's ratio: where nbrpc spends more or less
than torch. A diagnosis, not a comparison with a target: ``user.py`` is that.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "user_script.py"
PHASES = ("driver calls", "driver pickles", "to the worker", "worker unpickles", "worker runs",
          "worker pickles", "to the driver", "driver unpickles", "driver returns", "whole call")

# Run in each process: note when each message is pickled and unpickled.
NOTING = """
import time as _time
import torch.distributed.rpc.internal as _internal
_notes = []
_internal._phase_notes = _notes
_serialize, _deserialize = _internal._InternalRPCPickler.serialize, _internal._InternalRPCPickler.deserialize
def _noted_serialize(self, obj):
    began = _time.perf_counter_ns()
    try:
        return _serialize(self, obj)
    finally:
        _notes.append(("pickled", began, _time.perf_counter_ns()))
def _noted_deserialize(self, body, tensors):
    began = _time.perf_counter_ns()
    try:
        return _deserialize(self, body, tensors)
    finally:
        _notes.append(("unpickled", began, _time.perf_counter_ns()))
_internal._InternalRPCPickler.serialize = _noted_serialize
_internal._InternalRPCPickler.deserialize = _noted_deserialize
"""
# Evaluated in the worker: its notes emptied; its notes so far, the list emptied.
_EMPTY = "__import__('torch.distributed.rpc.internal', fromlist=['_'])._phase_notes.clear()"
_TAKE = ("(lambda notes: (list(notes), notes.clear())[0])"
         "(__import__('torch.distributed.rpc.internal', fromlist=['_'])._phase_notes)")


def _take_notes() -> list:
    """This process's notes so far, the list emptied."""
    import torch.distributed.rpc.internal as internal

    notes = list(internal._phase_notes)
    internal._phase_notes.clear()
    return notes


def measure(rounds: int, calls: int) -> dict[str, dict[str, list[float]]]:
    """Each kind's phases (us) per call, in this process as the driver, with torch RPC up,
    the script's cells run in ``__main__`` (``echo``, ``KINDS``: a cell's function, as
    nbrpc sends it; raw torch's worker, the script run as ``__main__``, has the same)."""
    import torch.distributed.rpc as rpc

    import __main__

    rpc.rpc_sync("worker1", exec, args=(NOTING, {}))
    exec(NOTING, {})
    found = {kind: {phase: [] for phase in PHASES} for kind in __main__.KINDS}
    for turn in range(rounds + 1):
        for kind, (args, kwargs, in_context) in __main__.KINDS.items():
            if in_context:  # (a distributed autograd context's messages are torch's own)
                continue
            _take_notes()
            rpc.rpc_sync("worker1", eval, args=(_EMPTY,))
            _take_notes()
            spans = []
            for _ in range(calls):
                began = time.perf_counter_ns()
                rpc.rpc_sync("worker1", __main__.echo, args=args, kwargs=kwargs)
                spans.append((began, time.perf_counter_ns()))
            driver = _take_notes()
            worker = rpc.rpc_sync("worker1", eval, args=(_TAKE,))
            if turn:  # the first: connections, threads, each kind's first send
                _split(found[kind], spans, driver, worker)
    return {kind: phases for kind, phases in found.items() if phases["whole call"]}


def _split(phases: dict, spans: list, driver: list, worker: list) -> None:
    """Each call's phases from the notes of both sides. The worker's notes begin with the
    reply to the call that emptied them and end with the call that took them."""
    pickled = [n for n in driver if n[0] == "pickled"]
    unpickled = [n for n in driver if n[0] == "unpickled"]
    served = [n for n in worker if n[0] == "unpickled"][:len(spans)]
    replied = [n for n in worker if n[0] == "pickled"][1:len(spans) + 1]
    for (began, ended), out, back, got, answered in zip(spans, pickled, unpickled, served, replied):
        marks = (began, out[1], out[2], got[1], got[2], answered[1], answered[2], back[1], back[2], ended)
        for phase, (start, end) in zip(PHASES, zip(marks, marks[1:])):
            phases[phase].append((end - start) / 1e3)
        phases["whole call"].append((ended - began) / 1e3)


def run_side(side: str, rounds: int, calls: int) -> dict:
    """One side's phases: nbrpc (a one-worker cluster of this process) or raw torch (this
    process and a plain one under ``init_rpc`` on ``uv``)."""
    import torch.distributed.rpc as rpc

    if side == "nbrpc":
        import nbrpc

        cluster = nbrpc.start(1, progress=None)
        try:
            return measure(rounds, calls)
        finally:
            cluster.shutdown()
    with tempfile.TemporaryDirectory(prefix="nbrpc-phases-") as scratch:
        store = str(Path(scratch) / "store")
        peer = subprocess.Popen([sys.executable, str(SCRIPT), "raw-uv", "1", store], start_new_session=True)
        try:
            options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{store}", _transports=["uv"])
            rpc.init_rpc("master", rank=0, world_size=2, rpc_backend_options=options)
            try:
                return measure(rounds, calls)
            finally:
                rpc.shutdown()
        finally:
            try:
                peer.wait(timeout=60)
            finally:
                if peer.poll() is None:
                    peer.kill()
                    peer.wait()


def table(sides: dict[str, dict]) -> str:
    """Per phase and kind: nbrpc's median and raw torch's; last, the whole call's ratio."""
    kinds = list(next(iter(sides.values())))
    medians = {side: {kind: {phase: statistics.median(values) for phase, values in phases.items()}
                      for kind, phases in found.items()} for side, found in sides.items()}
    lines = [f"{'us, nbrpc / raw':<18}" + "".join(f"{kind:>17}" for kind in kinds)]
    for phase in PHASES:
        cells = (f"{medians['nbrpc'][kind][phase]:.1f} / {medians['raw'][kind][phase]:.1f}" for kind in kinds)
        lines.append(f"{phase:<18}" + "".join(f"{cell:>17}" for cell in cells))
    ratios = (medians["nbrpc"][kind]["whole call"] / medians["raw"][kind]["whole call"] for kind in kinds)
    lines.append(f"{'ratio':<18}" + "".join(f"{ratio:>17.3f}" for ratio in ratios))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--side", choices=("nbrpc", "raw"), help="(internal) measure one side and print it")
    args = parser.parse_args()
    if args.side:
        if args.side == "nbrpc":
            import nbrpc  # noqa: F401 (before torch, as a notebook's first cell)
        text = SCRIPT.read_text()
        exec(text.split("# -- cells begin\n", 1)[1].split("# -- cells end", 1)[0], globals())
        print(json.dumps(run_side(args.side, args.rounds, args.calls)))
        return 0
    sides = {}
    for side in ("nbrpc", "raw"):  # each in a process of its own: a process holds one RPC group
        done = subprocess.run([sys.executable, __file__, "--side", side, "--rounds", str(args.rounds),
                               "--calls", str(args.calls)], capture_output=True, text=True, timeout=900,
                              start_new_session=True)
        if done.returncode:
            raise RuntimeError(f"phases: the {side} side failed:\n{done.stderr[-3000:]}")
        sides[side] = json.loads(done.stdout.splitlines()[-1])
    print(table(sides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
