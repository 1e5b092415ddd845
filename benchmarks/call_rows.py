"""Rows of the in-run comparison of calls (``calls.compare_calls``), and the breakdown of a
small call's latency printed under the table.
"""

from __future__ import annotations

import statistics

from results import row


def pooled_median(rounds: list[list[float]]) -> float:
    return statistics.median(sample for samples in rounds for sample in samples)


def count(rounds: list[list[float]]) -> int:
    return sum(len(samples) for samples in rounds)


def medians_ms(sides: dict[str, list], scale: float = 1e3) -> dict[str, float]:
    return {side: pooled_median(rounds) * scale for side, rounds in sides.items()}


def paired_ratio(on: list[list[float]], off: list[list[float]]) -> float:
    """The median of each round's ratio of medians (within a round the two sides took
    turns every few calls, so the machine's drift cancels)."""
    return statistics.median(statistics.median(a) / statistics.median(b) for a, b in zip(on, off))


def twins(calls: dict) -> dict[str, tuple[float, float]]:
    """The second raw ``uv`` pair and the first, per measurement they both took: ms per
    small call and per ``rpc.remote``, calls/s."""
    found = {op: (pooled_median(calls[op]["raw_twin"]) * 1e3, pooled_median(calls[op]["raw"]) * 1e3)
             for op in ("latency", "remote")}
    found["throughput"] = tuple(statistics.median(calls["throughput"][side]) for side in ("raw_twin", "raw"))
    return found


def spread_row(calls: dict) -> dict:
    """The run's spread: of the twin pair's ratios, the one farthest from 1."""
    ratios = {op: second / first for op, (second, first) in twins(calls).items()}
    op = max(ratios, key=lambda key: max(ratios[key], 1 / ratios[key]))
    second, first = twins(calls)[op]
    return row("spread", second, first, ratio=ratios[op],
               note=f"the farthest from 1 of the twin pair's ratios ({op}, in its unit): "
                    + ", ".join(f"{key} {r:.3f}" for key, r in ratios.items()))


def call_rows(calls: dict) -> list[dict]:
    """Every row of the in-run comparison."""
    return [*small_call_rows(calls), *cell_rows(calls["cells"]), *rref_rows(calls), *rate_rows(calls)]


def small_call_rows(calls: dict) -> list[dict]:
    latency, idle = medians_ms(calls["latency"]), calls["idle"]
    note = f"medians of {count(calls['latency']['nbrpc']):,} calls a side, in turns"
    return [
        row("idle_cpu", idle["nbrpc"], idle["raw_shm"]),
        row("idle_cpu_shm", idle["nbrpc_shm"], idle["raw_shm"]),
        row("rpc_sync", latency["nbrpc"], latency["raw"], note=note),
        spread_row(calls),
        row("rpc_sync_shm", latency["nbrpc_shm"], latency["raw_shm"], note=note),
        *on_off_rows(calls),
    ]


def on_off_rows(calls: dict) -> list[dict]:
    """Recording and serving, those measured: two sides in turns every few calls within
    each round."""
    handoff = calls.get("handoff") or {}
    entries = [("recording", calls.get("recording"), "on", "off"),
               *((key, handoff.get(key), "served", "plain") for key in ("handoff", "handoff_forced"))]
    found = []
    for key, samples, on, off in entries:
        if not samples:
            continue
        ms = medians_ms(samples)
        found.append(row(key, ms[on], ms[off], ratio=paired_ratio(samples[on], samples[off]),
                         note=f"ratio: the median of {len(samples[on])} rounds' ratios, "
                              f"{count(samples[off]):,} calls a side"))
    return found


def cell_rows(cells: dict) -> list[dict]:
    found = []
    for op, func in {"cell_sync": "echo", "cell_async": "echo", "cell_remote": "echo",
                     "cell_globals": "scaled"}.items():
        ms = medians_ms(cells["samples"][op])
        sent = f"{cells['bytes']['nbrpc'][func]} bytes a call, raw {cells['bytes']['raw'][func]}"
        found.append(row(op, ms["nbrpc"], ms["raw"], note=f"{sent}; medians of "
                                                         f"{count(cells['samples'][op]['nbrpc']):,} calls a side"))
    return found


def rref_rows(calls: dict) -> list[dict]:
    remote = medians_ms(calls["remote"])
    local = medians_ms(calls["local_rref"], 1e6)
    tracking, local_tracking = medians_ms(calls["tracking"]), medians_ms(calls["local_tracking"], 1e6)
    return [
        row("remote", remote["nbrpc"], remote["raw"],
            note=f"the driver's tracking from its own turns: {tracking['on'] - tracking['off']:+.3f} ms"),
        row("local_rref", local["nbrpc"], local["raw"],
            note=f"tracking from its own turns: {local_tracking['on'] - local_tracking['off']:+.2f} us"),
    ]


def rate_rows(calls: dict) -> list[dict]:
    throughput = {side: statistics.median(rates) for side, rates in calls["throughput"].items()}
    tensor = medians_ms(calls["tensor"])
    two_copies = 2 * pooled_median(calls["copies"]) * 1e3
    return [
        row("throughput", throughput["nbrpc"], throughput["raw"],
            note=f"median of {len(calls['throughput']['nbrpc'])} rounds"),
        row("tensor", tensor["nbrpc"], tensor["raw"]),
        row("tensor_copies", tensor["nbrpc"], two_copies,
            note=f"shared memory's huge pages: {shmem_huge_pages()}"),
        row("tensor_shm", tensor["nbrpc_shm"], tensor["raw_shm"]),
        row("tensor_defaults", tensor["nbrpc"], tensor["raw_default"]),
    ]


def shmem_huge_pages() -> str:
    """The system's policy for huge pages in shared memory, which the segments of big
    tensors use where it allows (``never``: 4 KiB pages, copies about 1.3x slower)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unknown"


def breakdown(calls: dict) -> str:
    """Where nbrpc's small-call latency goes, as lines under the table."""
    sync, rec = medians_ms(calls["latency"]), medians_ms(calls["recording"])
    remote, tracking = medians_ms(calls["remote"]), medians_ms(calls["tracking"])
    return (
        f"rpc_sync median (ms): nbrpc {sync['nbrpc']:.3f}, raw torch {sync['raw']:.3f}"
        f"\n  {sync['nbrpc'] - sync['nbrpc_unwrapped']:+.3f} nbrpc's interruptible rpc_sync wrapper"
        f"\n  {sync['nbrpc_unwrapped'] - sync['raw']:+.3f} the rest: pickler, group set-up, kernel processes "
        f"(torch's own rpc_sync in the nbrpc cluster: {sync['nbrpc_unwrapped']:.3f})"
        f"\n  {rec['on'] - rec['off']:+.3f} call recording, when on (off by default), from its own turns"
        f"\nrpc.remote + to_here median (ms): nbrpc {remote['nbrpc']:.3f}, raw torch {remote['raw']:.3f}"
        f"\n  {tracking['on'] - tracking['off']:+.3f} the driver's RRef tracking, from its own turns"
    )
