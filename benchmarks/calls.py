"""The in-run comparison of calls: nbrpc clusters and raw torch pairs taking turns.

Two nbrpc clusters (a plain script as the driver, worker1; transport ``uv``, the default,
and ``shm``) and four raw ``rpc.init_rpc`` pairs (``uv`` twice, ``shm``, and all of
torch's defaults) take turns in short rounds, each paused (SIGSTOP) while another
measures, so a burst of load from elsewhere hits them alike. The second ``uv`` pair runs
the same code as the first: how far the two part is the run's spread.

``compare_calls`` returns the samples by measurement, then by side (one list entry per
round); ``call_rows`` turns them into rows.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass

import processes
import timing
import usage


@dataclass(frozen=True)
class Sizes:
    """Rounds and calls per round of each measurement (``QUICK``: a smoke test's)."""

    latency_rounds: int = 10
    latency_calls: int = 200  # 2,000 calls per side
    # Recording's cost is a percent or two of a small call, less than the machine's drift
    # from one round to the next: on and off take turns every few calls within a round.
    on_off_rounds: int = 30
    on_off_calls: int = 400
    throughput_rounds: int = 6
    throughput_calls: int = 1000
    tensor_rounds: int = 4
    tensor_trips: int = 2
    idle_seconds: float = 3.0


FULL = Sizes()
QUICK = Sizes(latency_rounds=2, latency_calls=50, on_off_rounds=2, on_off_calls=40, throughput_rounds=2,
              throughput_calls=200, tensor_rounds=1, tensor_trips=1, idle_seconds=0.5)
SETTINGS = dict(threads=16, timeout=60.0)  # nbrpc's defaults, given to both sides
_BEGAN = time.perf_counter()


def progress(message: str) -> None:
    """A line on stderr per phase: the run takes minutes."""
    print(f"bench: {message} ({time.perf_counter() - _BEGAN:.0f} s)", file=sys.stderr, flush=True)


def measure(group: processes.Group, op: str, count: int):
    """Run one measurement with only ``group`` awake."""
    group.resume()
    try:
        return group.measure(op, count)
    finally:
        group.pause()


def take_turns(variants: dict, rounds: int, count: int) -> dict[str, list]:
    """Each round measures every variant once, the order rotating from round to round.
    ``variants`` maps a name to ``(group, op)``."""
    results = {name: [] for name in variants}
    names = list(variants)
    for turn in range(rounds):
        shift = turn % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(measure(*variants[name], count))
    return results


def ready(*groups: processes.Group) -> None:
    """Wait for each group, pause it, and make its first (untimed) calls: they pay for
    connections, thread start-up and allocator growth."""
    for group in groups:
        group.wait_ready()
        group.pause()
        for op, count in (("latency", 200), ("remote", 200), ("throughput", 300), ("tensor", 2)):
            measure(group, op, count)


def idle_cpu(group: processes.Group, seconds: float) -> float:
    """Percent of a core the busiest member of ``group`` uses while nothing is asked of it."""
    group.resume()
    try:
        time.sleep(1.0)  # past the wake-up
        members = group.pids
        before = [usage.cpu_seconds(pid) for pid in members]
        time.sleep(seconds)
        after = [usage.cpu_seconds(pid) for pid in members]
    finally:
        group.pause()
    return max(b - a for a, b in zip(before, after)) / seconds * 100


def on_off_turns(cluster: processes.Group, op: str, sizes: Sizes, sides=("on", "off")) -> dict[str, list]:
    """``op``'s rounds (see ``nbrpc_driver.py``), by side."""
    progress(f"{op}: {' and '.join(sides)} in turns, {sizes.on_off_rounds} rounds")
    rounds = [measure(cluster, op, sizes.on_off_calls) for _ in range(sizes.on_off_rounds)]
    return {side: [r[side] for r in rounds] for side in sides}


def handoff_turns(cluster: processes.Group, sizes: Sizes) -> dict[str, dict]:
    turns = {op: on_off_turns(cluster, op, sizes, ("served", "plain")) for op in ("handoff", "handoff_forced")}
    measure(cluster, "handoff", 10)  # back to the default limit
    return turns


# What each cell-function row calls: the op (``timing.measure``) and the function whose
# bytes per call its note shows.
CELL_OPS = {"cell_sync": "echo", "cell_async": "echo", "cell_remote": "echo", "cell_globals": "scaled"}


def cell_calls(nbrpc_uv: processes.Group, raw_uv: processes.Group, sizes: Sizes) -> dict:
    """A function defined in the nbrpc driver's ``__main__`` (as in a cell) against raw
    torch calling the same code from an importable module, both over ``uv``, taking
    turns; and the bytes each call sends."""
    progress(f"a cell's function against an importable one, {sizes.latency_rounds} rounds")
    samples = {op: take_turns({"nbrpc": (nbrpc_uv, op), "raw": (raw_uv, op)}, sizes.latency_rounds,
                              sizes.latency_calls) for op in CELL_OPS}
    sent = {"nbrpc": measure(nbrpc_uv, "cell_bytes", 1), "raw": measure(raw_uv, "cell_bytes", 1)}
    return {"samples": samples, "bytes": sent}


def compare_calls(sizes: Sizes = FULL) -> dict:
    """Every call measurement of the in-run comparison."""
    progress("starting two nbrpc clusters and four raw torch RPC pairs")
    with contextlib.ExitStack() as stack:
        groups = {name: stack.enter_context(start()) for name, start in (
            ("nbrpc", lambda: processes.nbrpc_cluster(**SETTINGS)),
            ("nbrpc_shm", lambda: processes.nbrpc_cluster(transport="shm", **SETTINGS)),
            ("raw", lambda: processes.raw_pair(fast_alloc=True, transport="uv", **SETTINGS)),
            ("raw_twin", lambda: processes.raw_pair(fast_alloc=True, transport="uv", **SETTINGS)),
            ("raw_shm", lambda: processes.raw_pair(fast_alloc=True, **SETTINGS)),
            ("raw_default", lambda: processes.raw_pair(fast_alloc=False, **SETTINGS)))}
        ready(*groups.values())
        found = _small_calls(groups, sizes)
        found.update(_rrefs_and_rates(groups, sizes))
        progress("stopping the RPC groups")
    return found


def _small_calls(groups: dict, sizes: Sizes) -> dict:
    ours = groups["nbrpc"]
    progress(f"idle CPU, {sizes.idle_seconds:g} s per group")
    idle = {side: idle_cpu(groups[side], sizes.idle_seconds) for side in ("nbrpc", "nbrpc_shm", "raw", "raw_shm")}
    progress(f"rpc_sync latency, {sizes.latency_rounds} rounds")
    variants = {"nbrpc": (ours, "latency"), "nbrpc_unwrapped": (ours, "latency_unwrapped")}
    variants.update({side: (groups[side], "latency") for side in ("raw", "raw_twin", "nbrpc_shm", "raw_shm")})
    latency = take_turns(variants, sizes.latency_rounds, sizes.latency_calls)
    recording = on_off_turns(ours, "recording", sizes)
    return {"idle": idle, "latency": latency, "recording": recording,
            "handoff": handoff_turns(ours, sizes), "cells": cell_calls(ours, groups["raw"], sizes)}


def _rrefs_and_rates(groups: dict, sizes: Sizes) -> dict:
    ours, raw, twin = groups["nbrpc"], groups["raw"], groups["raw_twin"]
    progress(f"rpc.remote latency, {sizes.latency_rounds} rounds")
    remote = take_turns({"nbrpc": (ours, "remote"), "raw": (raw, "remote"), "raw_twin": (twin, "remote")},
                        sizes.latency_rounds, sizes.latency_calls)
    tracking = on_off_turns(ours, "remote_tracking", sizes)
    local_rref = take_turns({"nbrpc": (ours, "local_rref"), "raw": (raw, "local_rref")},
                            sizes.latency_rounds, sizes.latency_calls)
    local_tracking = on_off_turns(ours, "local_rref_tracking", sizes)
    progress(f"rpc_async throughput, {sizes.throughput_rounds} rounds")
    throughput = take_turns({"nbrpc": (ours, "throughput"), "raw": (raw, "throughput"),
                             "raw_twin": (twin, "throughput")}, sizes.throughput_rounds, sizes.throughput_calls)
    progress(f"{timing.TENSOR_MB} MiB round trips, {sizes.tensor_rounds} rounds")
    tensor = take_turns({side: (group, "tensor") for side, group in groups.items()},
                        sizes.tensor_rounds, sizes.tensor_trips)
    copies = [timing.copy_seconds(sizes.tensor_trips) for _ in range(sizes.tensor_rounds)]  # all paused
    return {"remote": remote, "tracking": tracking, "local_rref": local_rref, "local_tracking": local_tracking,
            "throughput": throughput, "tensor": tensor, "copies": copies}
