"""nbrpc next to raw torch RPC, side by side in one run (``make bench``;
``python benchmarks/run.py --recording``: call recording's cost alone; ``--handoff``:
the cost of running each call's function on a serving thread alone; ``--cuda``: small
calls through a device map alone, where torch sees a GPU).

Calls: idle CPU per member, small ``rpc_sync`` latency, ``rpc.remote`` latency (RRef
tracking on), ``rpc_async`` throughput and a 100 MiB tensor round trip, through an
nbrpc cluster (a plain script as the driver, worker1) with its default transport
(``uv``) and with ``shm`` (torch's default), and through plain ``rpc.init_rpc`` pairs
of processes with each (the ``uv`` pair twice: two measurements of the same code show
how far this run's figures part by chance); the 100 MiB trip also through a pair left
at all of torch's defaults. The groups take turns in short rounds, each paused (SIGSTOP)
while another measures, so a burst of load from elsewhere hits them alike.

Then, each a script of its own that prints its table: start-up cold and warm next to
``import torch`` with PSS per worker (``startup.py``), a notebook-defined function
against by-value pickling (``definitions.py``), a call that prints against one that
does not (``output.py``), the bookkeeping of pending calls that ``nbrpc.waits()``
reads against a small call (``pending.py``, target at most 1%), the scale table
(``scale.py``: 1 to 32 local workers), the wall time of tutorials 01, 02 and 04, and the
driver across 20 cluster cycles (``cycles.py``). The call table also goes to
``build/bench.json``. It exits 1 when a target row fails, naming each at the end.
"""

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cycles
import processes
import timing
import torch

HERE = Path(__file__).resolve().parent
REPORT = HERE.parent / "build" / "bench.json"

THREADS, TIMEOUT = 16, 60.0  # nbrpc's defaults, given to both sides
LATENCY_ROUNDS, LATENCY_CALLS = 10, 200  # 2,000 calls per side
# Call recording costs a percent or two of a small call, less than the machine's drift
# from one round to the next: on and off take turns every few calls within each round
# (see ``nbrpc_driver.py``), and each round gives one on/off ratio.
RECORDING_ROUNDS, RECORDING_CALLS = 30, 400  # 6,000 calls per side
THROUGHPUT_ROUNDS, THROUGHPUT_CALLS, IN_FLIGHT = 6, 1000, 32
TENSOR_ROUNDS, TENSOR_TRIPS = 4, 2
CUDA_TENSOR_CALLS = 20  # per round, of the 64 MiB CUDA tensor
IDLE_SECONDS = 3.0
TUTORIALS = ("01_parameter_server", "02_pipeline_parallel", "04_federated_learning")


_BEGAN = time.perf_counter()


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if "--cells" in sys.argv[1:]:  # only the cell-function rows: a minute or two
        rows = cells_only()
        print(render(rows))
        return verdict([row["metric"] for row in rows if row["pass"] is False])
    if "--recording" in sys.argv[1:]:  # only call recording's cost: a minute, not the whole run
        row = recording_overhead()
        print(render([row]))
        return verdict([row["metric"]] if row["pass"] is False else [])
    if "--cuda" in sys.argv[1:]:  # only the small calls through a device map (a GPU)
        table, failed = compare_cuda_calls()
        print(table)
        return verdict(failed)
    if "--handoff" in sys.argv[1:]:  # only the serving threads' cost
        rows = handoff_overhead()
        print(render(rows))
        return verdict([row["metric"] for row in rows if row["pass"] is False])
    calls = compare_calls()
    rows = summarize(calls)
    breakdown = latency_breakdown(calls)
    print(render(rows))
    print(render_breakdown(breakdown))
    write_report(rows, breakdown, calls, _elapsed())
    print(f"\nwrote {REPORT} ({_elapsed():.0f} s)")
    failed = [row["metric"] for row in rows if row["pass"] is False]
    progress("small calls through a device map, if there is a GPU")
    cuda_table, cuda_failed = compare_cuda_calls()
    print(cuda_table)
    failed += cuda_failed
    progress("start-up, cold and warm, and PSS per worker")
    failed += _script("startup.py", "--runs", "2")
    progress("a notebook-defined function, bound once against by value")
    failed += _script("definitions.py", "--calls", "2000")
    progress("a worker's output in the calling cell, per small call")
    failed += _script("output.py", "--calls", "2000")
    progress("the always-on bookkeeping of pending calls, per small call")
    failed += _script("pending.py", "--calls", "2000")
    progress("the scale table: 1, 4, 16 and 32 local workers")
    failed += _script("scale.py")
    progress("tutorials' wall time")
    print(render_tutorials(tutorial_seconds()))
    progress(f"cluster cycles, {cycles.CYCLES}")
    if cycles.main():
        failed.append(f"cluster cycles: growth within {cycles.TARGET_FDS} descriptors and {cycles.TARGET_MB:g} MB")
    return verdict(failed)


def verdict(failed: list[str]) -> int:
    """Name every target that was missed; the exit status ``make bench`` passes on."""
    if not failed:
        print("\nbench: every target met")
        return 0
    print(f"\nbench: {len(failed)} target{'s' * (len(failed) > 1)} missed:")
    print("\n".join(f"  FAIL  {what}" for what in failed))
    return 1


def _script(name: str, *args: str) -> list[str]:
    """Run another benchmark script of this folder; its table goes to our stdout. It
    exits 1 when one of its targets is missed (the rows say which), any other non-zero
    status when it failed to run: either way, one failed entry."""
    print(flush=True)
    status = subprocess.run([sys.executable, str(HERE / name), *args], timeout=900).returncode
    if status == 0:
        return []
    return [f"{name}: {'a target missed (see its table)' if status == 1 else f'failed to run (exit {status})'}"]


def tutorial_seconds() -> dict[str, float]:
    """Wall time of each of ``TUTORIALS`` run headless, top to bottom (``nbrpc run``)."""
    seconds = {}
    for name in TUTORIALS:
        source = HERE.parent / "tutorials" / f"{name}.ipynb"
        output = HERE.parent / "build" / "bench" / f"{name}.ipynb"
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "nbrpc.cli", "run", str(source), "--output", str(output)],
                       check=True, timeout=600, capture_output=True)
        seconds[name] = time.perf_counter() - began
    return seconds


def render_tutorials(seconds: dict[str, float]) -> str:
    lines = [f"\n{'tutorial, run headless (nbrpc run)':<40} {'wall s':>7}"]
    lines += [f"{name:<40} {s:>7.1f}" for name, s in seconds.items()]
    return "\n".join(lines)


def progress(message: str) -> None:
    """A line on stderr per phase: the run takes minutes."""
    print(f"bench: {message} ({_elapsed():.0f} s)", file=sys.stderr, flush=True)


def _elapsed() -> float:
    return time.perf_counter() - _BEGAN


# -- measurements 1-3: calls ----------------------------------------------------------


def compare_calls() -> dict:
    """Results by measurement, then by side: one list entry per round."""
    settings = dict(threads=THREADS, timeout=TIMEOUT)
    progress("starting two nbrpc clusters and four raw torch RPC pairs")
    with contextlib.ExitStack() as stack:
        nbrpc_uv = stack.enter_context(processes.nbrpc_cluster(**settings))
        nbrpc_shm = stack.enter_context(processes.nbrpc_cluster(transport="shm", **settings))
        raw_uv = stack.enter_context(processes.raw_pair(fast_alloc=True, transport="uv", **settings))
        # The same pair again: how far two runs of the same code part in this run.
        raw_twin = stack.enter_context(processes.raw_pair(fast_alloc=True, transport="uv", **settings))
        raw_shm = stack.enter_context(processes.raw_pair(fast_alloc=True, **settings))
        raw_default = stack.enter_context(processes.raw_pair(fast_alloc=False, **settings))
        groups = {"nbrpc": nbrpc_uv, "nbrpc_shm": nbrpc_shm, "raw": raw_uv, "raw_twin": raw_twin,
                  "raw_shm": raw_shm, "raw_default": raw_default}
        for group in groups.values():
            group.wait_ready()
            group.pause()  # until its turn, so the others start and measure undisturbed
            _warm_up(group)
        progress(f"idle CPU, {IDLE_SECONDS:g} s per group")
        idle = {side: idle_cpu(groups[side]) for side in ("nbrpc", "nbrpc_shm", "raw", "raw_shm")}
        progress(f"rpc_sync latency, {LATENCY_ROUNDS} rounds")
        latency = _take_turns({"nbrpc": (nbrpc_uv, "latency"),
                               "nbrpc_unwrapped": (nbrpc_uv, "latency_unwrapped"),
                               "raw": (raw_uv, "latency"), "raw_twin": (raw_twin, "latency"),
                               "nbrpc_shm": (nbrpc_shm, "latency"),
                               "raw_shm": (raw_shm, "latency")}, LATENCY_ROUNDS, LATENCY_CALLS)
        recording = _recording_turns(nbrpc_uv)
        handoff = _handoff_turns(nbrpc_uv)
        progress(f"rpc.remote latency, {LATENCY_ROUNDS} rounds")
        remote = _take_turns({"nbrpc": (nbrpc_uv, "remote"), "raw": (raw_uv, "remote")},
                             LATENCY_ROUNDS, LATENCY_CALLS)
        tracking = _on_off_turns(nbrpc_uv, "remote_tracking", "rpc.remote + to_here, the driver's RRef tracking")
        local_rref = _take_turns({"nbrpc": (nbrpc_uv, "local_rref"), "raw": (raw_uv, "local_rref")},
                                 LATENCY_ROUNDS, LATENCY_CALLS)
        local_tracking = _on_off_turns(nbrpc_uv, "local_rref_tracking", "RRef(value), the driver's RRef tracking")
        cells = cell_calls(nbrpc_uv, raw_uv)
        progress(f"rpc_async throughput, {THROUGHPUT_ROUNDS} rounds")
        throughput = _take_turns({"nbrpc": (nbrpc_uv, "throughput"), "raw": (raw_uv, "throughput")},
                                 THROUGHPUT_ROUNDS, THROUGHPUT_CALLS)
        progress(f"{timing.TENSOR_MB} MiB round trips, {TENSOR_ROUNDS} rounds")
        tensor = _take_turns({side: (group, "tensor") for side, group in groups.items()},
                             TENSOR_ROUNDS, TENSOR_TRIPS)
        copies = [timing.copy_seconds(TENSOR_TRIPS) for _ in range(TENSOR_ROUNDS)]  # every group paused
        progress("stopping the RPC groups")
    return {"idle": idle, "latency": latency, "recording": recording, "handoff": handoff, "remote": remote,
            "tracking": tracking, "local_tracking": local_tracking,
            "local_rref": local_rref, "throughput": throughput, "tensor": tensor, "copies": copies,
            "cells": cells}


# What each cell-function row calls: the op (``timing.measure``), what it is, and the
# function whose bytes per call it shows.
CELL_OPS = {
    "cell_sync": ("rpc_sync", "echo"),
    "cell_async": ("rpc_async + wait", "echo"),
    "cell_remote": ("rpc.remote + to_here", "echo"),
    "cell_globals": ("rpc_sync, with 3 globals", "scaled"),
}


def cell_calls(nbrpc_uv: processes.Group, raw_uv: processes.Group) -> dict:
    """A function defined in the nbrpc driver's ``__main__`` (as in a cell) against raw
    torch calling the same code from an importable module, both over ``uv``, taking
    turns; and the bytes each call sends."""
    progress(f"a cell's function against an importable one, {LATENCY_ROUNDS} rounds")
    samples = {op: _take_turns({"nbrpc": (nbrpc_uv, op), "raw": (raw_uv, op)}, LATENCY_ROUNDS, LATENCY_CALLS)
               for op in CELL_OPS}
    sizes = {"nbrpc": _measure(nbrpc_uv, "cell_bytes", 1), "raw": _measure(raw_uv, "cell_bytes", 1)}
    return {"samples": samples, "bytes": sizes}


def cell_rows(cells: dict) -> list[dict]:
    rows = []
    for op, (what, func) in CELL_OPS.items():
        ms = {side: _pooled_median(rounds) * 1e3 for side, rounds in cells["samples"][op].items()}
        sent = f"{cells['bytes']['nbrpc'][func]} B/call vs {cells['bytes']['raw'][func]}"
        rows.append(_row(f"{what} of a cell's function ({sent}), vs importable, median of "
                         f"{_count(cells['samples'][op]['nbrpc']):,} (ms)",
                         ms["nbrpc"], ms["raw"], "nbrpc/raw", "<=", 1.05))
    return rows


def cells_only() -> list[dict]:
    """``python run.py --cells``: the cell-function rows alone."""
    settings = dict(threads=THREADS, timeout=TIMEOUT)
    progress("starting an nbrpc cluster and a raw torch RPC pair")
    with processes.nbrpc_cluster(**settings) as ours, \
            processes.raw_pair(fast_alloc=True, transport="uv", **settings) as raw:
        for group in (ours, raw):
            group.wait_ready()
            group.pause()
            _warm_up(group)
        rows = cell_rows(cell_calls(ours, raw))
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return rows


def compare_cuda_calls() -> tuple[str, list[str]]:
    """Small ``rpc_sync`` calls with a CPU and with a CUDA tensor, and a 64 MiB CUDA tensor's
    round trip, nbrpc next to raw torch with the same transport (uv) and the same map: the driver's cuda:0 to worker1's
    cuda:1 with two GPUs, cuda:0 with one (both processes on it, TensorPipe's CUDA IPC
    channel between them). The table, or why it did not run, and the rows that failed."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 1:
        return (f"\nCUDA calls: skipped, torch sees no GPU (torch.cuda.is_available() is "
                f"{torch.cuda.is_available()})", [])
    gpu = 1 if count > 1 else 0
    settings = dict(threads=THREADS, timeout=TIMEOUT, device_map=gpu, transport="uv")
    progress(f"CUDA calls: starting an nbrpc cluster and a raw pair, map cuda:0 -> cuda:{gpu}")
    with processes.nbrpc_cluster(**settings) as ours, processes.raw_pair(fast_alloc=True, **settings) as raw:
        for group in (ours, raw):
            group.wait_ready()
            group.pause()
            _measure(group, "cuda_latency", LATENCY_CALLS)  # CUDA contexts, IPC handles, streams
        cuda = _take_turns({"nbrpc": (ours, "cuda_latency"), "nbrpc_unwrapped": (ours, "cuda_latency_unwrapped"),
                            "raw": (raw, "cuda_latency")}, LATENCY_ROUNDS, LATENCY_CALLS)
        cpu = _take_turns({"nbrpc": (ours, "latency"), "raw": (raw, "latency")}, LATENCY_ROUNDS, LATENCY_CALLS)
        big = _take_turns({"nbrpc": (ours, "cuda_tensor"), "raw": (raw, "cuda_tensor")},
                          LATENCY_ROUNDS, CUDA_TENSOR_CALLS)
    ms = {side: _pooled_median(rounds) * 1e3 for side, rounds in cuda.items()}
    cpu_ms = {side: _pooled_median(rounds) * 1e3 for side, rounds in cpu.items()}
    big_ms = {side: _pooled_median(rounds) * 1e3 for side, rounds in big.items()}
    calls = _count(cuda["nbrpc"])
    rows = [_row(f"rpc_sync, CPU tensor, map 0 -> {gpu}, median of {calls:,} (ms)",
                 cpu_ms["nbrpc"], cpu_ms["raw"], "nbrpc/raw", "<=", 1.05),
            _row(f"rpc_sync, CUDA tensor, map 0 -> {gpu}, median of {calls:,} (ms)",
                 ms["nbrpc"], ms["raw"], "nbrpc/raw", "<=", 1.05),
            _row(f"rpc_sync, {timing.CUDA_TENSOR_MB} MiB CUDA tensor there and back, map 0 -> {gpu}, "
                 f"median of {_count(big['nbrpc']):,} (ms)", big_ms["nbrpc"], big_ms["raw"], "nbrpc/raw", "<=", 1.05)]
    table = (f"\nCUDA calls on {torch.cuda.get_device_name(0)} ({count} GPU{'s' * (count > 1)}), "
             f"uv on both sides\n{render(rows)}\n  {ms['nbrpc'] - ms['nbrpc_unwrapped']:+.3f} ms of the "
             f"CUDA call in nbrpc's rpc_sync wrapper (torch's own rpc_sync in the nbrpc cluster: "
             f"{ms['nbrpc_unwrapped']:.3f})")
    return table, [row["metric"] for row in rows if row["pass"] is False]


def recording_overhead() -> dict:
    """Small ``rpc_sync`` latency with call recording on and off, in one nbrpc cluster
    (``python run.py --recording``; the full run has this row too)."""
    progress("starting an nbrpc cluster")
    with processes.nbrpc_cluster(threads=THREADS, timeout=TIMEOUT) as cluster:
        cluster.wait_ready()
        _measure(cluster, "latency", 200)
        recording = _recording_turns(cluster)
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return recording_row(recording)


def _recording_turns(cluster: processes.Group) -> dict[str, list]:
    turns = _on_off_turns(cluster, "recording", "rpc_sync latency, call recording")
    return {"nbrpc_traced": turns["on"], "nbrpc": turns["off"]}


def _on_off_turns(cluster: processes.Group, op: str, what: str) -> dict[str, list]:
    """``op``'s rounds (see ``nbrpc_driver._on_and_off``), by side: "on" and "off"."""
    progress(f"{what} on and off, {RECORDING_ROUNDS} rounds")
    rounds = [_measure(cluster, op, RECORDING_CALLS) for _ in range(RECORDING_ROUNDS)]
    return {"on": [r["on"] for r in rounds], "off": [r["off"] for r in rounds]}


def recording_row(recording: dict[str, list]) -> dict:
    """Recording on against off: the median of each round's ratio (within a round the two
    take turns every few calls, so the machine's drift cancels)."""
    on, off = (_pooled_median(recording[side]) * 1e3 for side in ("nbrpc_traced", "nbrpc"))
    ratios = [statistics.median(a) / statistics.median(b)
              for a, b in zip(recording["nbrpc_traced"], recording["nbrpc"])]
    return _row(f"rpc_sync latency, call recording on vs off (nbrpc.trace), medians of "
                f"{_count(recording['nbrpc']):,}; ratio: median of {len(ratios)} rounds' (ms)",
                on, off, "nbrpc/raw", "<=", 1.03, columns=("recording on", "off"),
                ratio=statistics.median(ratios))


def handoff_overhead() -> list[dict]:
    """Small ``rpc_sync`` latency with the function served as nbrpc serves it and as
    torch would, in one nbrpc cluster (``python run.py --handoff``)."""
    progress("starting an nbrpc cluster")
    with processes.nbrpc_cluster(threads=THREADS, timeout=TIMEOUT) as cluster:
        cluster.wait_ready()
        _measure(cluster, "latency", 200)
        handoff = _handoff_turns(cluster)
    print(f"load average: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return handoff_rows(handoff)


def _handoff_turns(cluster: processes.Group) -> dict[str, dict]:
    turns = {}
    for op in ("handoff", "handoff_forced"):
        progress(f"rpc_sync latency, {op}: served by nbrpc and plain, {RECORDING_ROUNDS} rounds")
        rounds = [_measure(cluster, op, RECORDING_CALLS) for _ in range(RECORDING_ROUNDS)]
        turns[op] = {"served": [r["served"] for r in rounds], "plain": [r["plain"] for r in rounds]}
    _measure(cluster, "handoff", 10)  # back to the default limit
    return turns


def handoff_rows(turns: dict[str, dict]) -> list[dict]:
    """Served against plain: the median of each round's ratio, as for recording. The
    first row is what every call pays; the second, what a call pays when torch's
    threads are scarce and it is handed to a serving thread (no target: it replaces a
    wait for a free thread, or a deadlock)."""
    rows = []
    for op, what, bound in (("handoff", "as nbrpc serves every call", 1.03),
                            ("handoff_forced", "handed to a serving thread", None)):
        samples = turns[op]
        served, plain = (_pooled_median(samples[side]) * 1e3 for side in ("served", "plain"))
        ratios = [statistics.median(a) / statistics.median(b) for a, b in zip(samples["served"], samples["plain"])]
        rows.append(_row(f"rpc_sync latency, function {what} vs on torch's RPC thread as a plain "
                         f"function, medians of {_count(samples['plain']):,}; ratio: median of "
                         f"{len(ratios)} rounds' (ms)", served, plain, "nbrpc/raw", "<=", bound,
                         columns=("served", "plain"), ratio=statistics.median(ratios)))
    return rows


def idle_cpu(group: processes.Group) -> float:
    """Percent of a core each member of ``group`` uses while nothing is asked of it."""
    group.resume()
    try:
        time.sleep(1.0)  # past the wake-up
        members = group.pids
        before = [processes.cpu_seconds(pid) for pid in members]
        time.sleep(IDLE_SECONDS)
        after = [processes.cpu_seconds(pid) for pid in members]
    finally:
        group.pause()
    return max(b - a for a, b in zip(before, after)) / IDLE_SECONDS * 100


def _take_turns(variants: dict, rounds: int, count: int) -> dict[str, list]:
    """Each round measures every variant once, the order rotating from round to round.

    ``variants`` maps a name to ``(group, op)``; ``nbrpc_unwrapped`` is the nbrpc
    cluster calling torch's own ``rpc_sync`` (see ``nbrpc_driver.py``).
    """
    results = {name: [] for name in variants}
    for turn in range(rounds):
        for name in _rotated(list(variants), turn):
            results[name].append(_measure(*variants[name], count))
    return results


def _warm_up(group: processes.Group) -> None:
    """First calls pay for connections, thread start-up and allocator growth: not timed."""
    _measure(group, "latency", 200)
    _measure(group, "remote", 200)
    _measure(group, "throughput", 300)
    _measure(group, "tensor", 2)


def _measure(group: processes.Group, op: str, count: int):
    """Run one measurement with only ``group`` awake."""
    group.resume()
    try:
        return group.measure(op, count)
    finally:
        group.pause()


def _rotated(names: list[str], turn: int) -> list[str]:
    shift = turn % len(names)
    return names[shift:] + names[:shift]


# -- results ----------------------------------------------------------------------------


def _shmem_huge_pages() -> str:
    """The system's policy for huge pages in shared memory, which the segments of big
    tensors use where it allows (``never``: 4 KiB pages, copies about 1.3x slower here)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unknown"


def summarize(calls: dict) -> list[dict]:
    """One row per metric: both values, their ratio and whether it meets the target."""
    idle = calls["idle"]
    latency = {side: _pooled_median(rounds) * 1e3 for side, rounds in calls["latency"].items()}
    remote = {side: _pooled_median(rounds) * 1e3 for side, rounds in calls["remote"].items()}
    local_rref = {side: _pooled_median(rounds) * 1e6 for side, rounds in calls["local_rref"].items()}
    throughput = {side: statistics.median(rates) for side, rates in calls["throughput"].items()}
    tensor = {side: _pooled_median(rounds) * 1e3 for side, rounds in calls["tensor"].items()}
    two_copies = 2 * _pooled_median(calls["copies"]) * 1e3
    calls_counted = _count(calls["latency"]["nbrpc"])
    return [*cell_rows(calls["cells"]),
        _limit_row("idle CPU per member, vs raw torch default (% of a core)",
                   idle["nbrpc"], idle["raw_shm"], 1.0),
        _row("idle CPU per member, --transport shm vs raw torch default (% of a core)",
             idle["nbrpc_shm"], idle["raw_shm"], "nbrpc/raw", "<=", None),
        _row(f"rpc_sync latency, median of {calls_counted:,} (ms)",
             latency["nbrpc"], latency["raw"], "nbrpc/raw", "<=", 1.05),
        _row("rpc_sync latency, a second raw torch uv pair vs the first: the same code, so how far "
             "two measurements part in this run (ms)", latency["raw_twin"], latency["raw"], "twin/raw", "<=", None,
             columns=("second pair", "first pair")),
        recording_row(calls["recording"]),
        *handoff_rows(calls["handoff"]),
        _row(f"rpc_sync latency, --transport shm vs raw shm, median of {calls_counted:,} (ms)",
             latency["nbrpc_shm"], latency["raw_shm"], "nbrpc/raw", "<=", 1.05),
        _row(f"rpc.remote + to_here, tracking on, median of {_count(calls['remote']['nbrpc']):,} (ms)",
             remote["nbrpc"], remote["raw"], "nbrpc/raw", "<=", 1.05),
        _row("RRef(value) created and deleted: tracking's CPU, the difference (us)",
             local_rref["nbrpc"], local_rref["raw"], "nbrpc-raw", "<=", 2.0,
             ratio=local_rref["nbrpc"] - local_rref["raw"]),
        _row(f"rpc_async throughput, {IN_FLIGHT} in flight (calls/s)",
             throughput["nbrpc"], throughput["raw"], "raw/nbrpc", "<=", 1.05),
        _row(f"{timing.TENSOR_MB} MiB round trip, vs raw torch uv (ms)",
             tensor["nbrpc"], tensor["raw"], "nbrpc/raw", "<=", 0.6),
        _row(f"{timing.TENSOR_MB} MiB round trip, vs two copies of {timing.TENSOR_MB} MiB into a buffer in use "
             f"(shared memory's huge pages: {_shmem_huge_pages()}) (ms)",
             tensor["nbrpc"], two_copies, "nbrpc/raw", "<=", 1.3, columns=("nbrpc", "two copies")),
        _row(f"{timing.TENSOR_MB} MiB round trip, --transport shm vs raw shm (ms)",
             tensor["nbrpc_shm"], tensor["raw_shm"], "nbrpc/raw", "<=", None),
        _row(f"{timing.TENSOR_MB} MiB round trip vs all torch defaults (ms)",
             tensor["nbrpc"], tensor["raw_default"], "raw/nbrpc", ">=", 3.0),
    ]


def _limit_row(metric: str, ours: float, theirs: float, limit: float) -> dict:
    """A row whose target is nbrpc's own value (at most ``limit``); the ratio informs."""
    return {"metric": metric, "nbrpc": ours, "raw": theirs,
            "ratio": ours / theirs if theirs else float("nan"),
            "target": f"nbrpc <= {limit:g}", "pass": ours <= limit}


def _row(metric: str, ours: float, theirs: float, ratio_of: str, sense: str,
         bound: float | None, columns: tuple[str, str] | None = None, ratio: float | None = None) -> dict:
    """``ratio_of`` orders the ratio so that it reads as a cost ratio or a speed-up;
    a row without ``bound`` is there to explain the others. ``columns`` names what the
    two values are when they are not nbrpc and raw torch (the target reads ``on/off``);
    ``ratio``, when given, is one computed otherwise (paired rounds)."""
    if ratio is None:
        ratio = ours / theirs if ratio_of.startswith("nbrpc/") else theirs / ours
    if columns:
        ratio_of = "/".join(c.split()[-1] for c in columns)
    if bound is None:
        return {"metric": metric, "nbrpc": ours, "raw": theirs, "ratio": ratio,
                "target": "(no target)", "pass": None}
    passed = ratio <= bound if sense == "<=" else ratio >= bound
    return {"metric": metric, "nbrpc": ours, "raw": theirs, "ratio": ratio,
            "target": f"{ratio_of} {sense} {bound:g}", "pass": passed}


def _pooled_median(rounds: list[list[float]]) -> float:
    return statistics.median(sample for samples in rounds for sample in samples)


def _count(rounds: list[list[float]]) -> int:
    return sum(len(samples) for samples in rounds)


def latency_breakdown(calls: dict) -> dict:
    """Median latency (ms) per side of what the lines under the table read: ``rpc_sync``
    ("latency"), ``remote`` and ``RRef(value)`` ("local_rref"), and their on/off turns."""
    return {op: {side: _pooled_median(rounds) * 1e3 for side, rounds in calls[op].items()}
            for op in ("latency", "recording", "remote", "tracking", "local_rref", "local_tracking")}


def render_breakdown(medians: dict) -> str:
    """Where nbrpc's small-call latency goes, as lines under the table."""
    sync, remote, recording = medians["latency"], medians["remote"], medians["recording"]
    wrapper = sync["nbrpc"] - sync["nbrpc_unwrapped"]
    rest = sync["nbrpc_unwrapped"] - sync["raw"]
    tracking = medians["tracking"]
    local, local_tracking = ({side: ms * 1e3 for side, ms in medians[op].items()}  # in us
                             for op in ("local_rref", "local_tracking"))
    return (
        f"\nrpc_sync median (ms): nbrpc {sync['nbrpc']:.3f} = raw torch {sync['raw']:.3f}"
        f"\n  {wrapper:+.3f} nbrpc's interruptible rpc_sync wrapper"
        f"\n  {rest:+.3f} the rest: pickler, group set-up, kernel processes (torch's own"
        f" rpc_sync in the nbrpc cluster: {sync['nbrpc_unwrapped']:.3f})"
        f"\n  {recording['nbrpc_traced'] - recording['nbrpc']:+.3f} call recording, when on "
        f"(nbrpc.trace; off by default), from its own rounds: {recording['nbrpc_traced']:.3f} "
        f"against {recording['nbrpc']:.3f}"
        f"\n  load average during the run: {', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        f"\nrpc.remote + to_here median (ms): nbrpc {remote['nbrpc']:.3f}, raw torch {remote['raw']:.3f}"
        f"\n  {tracking['on'] - tracking['off']:+.3f} the driver's RRef tracking, from its own rounds (on and "
        f"off taking turns every few calls): {tracking['on']:.3f} "
        f"against {tracking['off']:.3f}"
        f"\nRRef(value) created and deleted median (us): nbrpc {local['nbrpc']:.2f}, raw torch {local['raw']:.2f}"
        f"\n  {local_tracking['on'] - local_tracking['off']:+.2f} the driver's RRef tracking, from its own rounds "
        f"(on and off taking turns every few lives): {local_tracking['on']:.2f} against {local_tracking['off']:.2f}"
    )


def render(rows: list[dict]) -> str:
    """The rows as an aligned text table."""
    header = ["metric", "nbrpc", "raw torch", "ratio", "target", "result"]
    lines = [[r["metric"], _number(r["nbrpc"]), _number(r["raw"]), f"{r['ratio']:.2f}",
              r["target"], {True: "pass", False: "FAIL", None: "info"}[r["pass"]]] for r in rows]
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    numeric = {1, 2, 3}

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, lines)])


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:#.3g}" if value < 10 else f"{value:.1f}"


def write_report(rows: list[dict], breakdown: dict, calls: dict, seconds: float) -> None:
    """``build/bench.json``: the table plus what it came from, for the README and CI logs."""
    report = {
        "rows": rows,
        "median_ms": breakdown,
        "rounds": {
            "latency_ms_p10_p90": {side: _spread(r) for side, r in calls["latency"].items()},
            "recording_ms_per_round": {side: [round(statistics.median(r) * 1e3, 4) for r in rounds]
                                       for side, rounds in calls["recording"].items()},
            "remote_ms_p10_p90": {side: _spread(r) for side, r in calls["remote"].items()},
            "throughput_calls_per_s": calls["throughput"],
            "tensor_ms": {side: [round(x * 1e3, 1) for trips in rounds for x in trips]
                          for side, rounds in calls["tensor"].items()},
            "idle_cpu_percent": calls["idle"],
        },
        "settings": {"num_worker_threads": THREADS, "rpc_timeout": TIMEOUT,
                     "rounds": {"latency": LATENCY_ROUNDS, "recording": RECORDING_ROUNDS,
                                "throughput": THROUGHPUT_ROUNDS,
                                "tensor": TENSOR_ROUNDS}},
        "machine": {"torch": torch.__version__, "python": platform.python_version(),
                    "cpus": os.cpu_count(), "platform": platform.platform()},
        "seconds": round(seconds, 1),
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


def _spread(rounds: list[list[float]]) -> list[float]:
    deciles = statistics.quantiles([x for samples in rounds for x in samples], n=10)
    return [round(deciles[0] * 1e3, 4), round(deciles[-1] * 1e3, 4)]


if __name__ == "__main__":
    sys.exit(main())
