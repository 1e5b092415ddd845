"""Small calls through a device map, where torch sees a GPU: nbrpc next to a raw pair
with the same transport (``uv``) and the same map (the driver's ``cuda:0`` to worker1's
``cuda:1`` with two GPUs, ``cuda:0`` with one: both processes on it, TensorPipe's CUDA
IPC channel between them): a CPU tensor, a small CUDA tensor, a 64 MiB CUDA tensor.
"""

from __future__ import annotations

import calls
import processes
from call_rows import count, medians_ms
from results import row

CUDA_TENSOR_CALLS = 20  # per round, of the 64 MiB CUDA tensor


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_rows(sizes: calls.Sizes) -> tuple[list[dict], str]:
    """The rows and a line on the wrapper's share; no rows (and why) without a GPU."""
    count_ = gpus()
    if count_ < 1:
        return [], "CUDA calls: torch sees no GPU"
    gpu = 1 if count_ > 1 else 0
    settings = dict(calls.SETTINGS, device_map=gpu, transport="uv")
    calls.progress(f"CUDA calls: an nbrpc cluster and a raw pair, map cuda:0 -> cuda:{gpu}")
    rounds, per_round = sizes.latency_rounds, sizes.latency_calls
    with processes.nbrpc_cluster(**settings) as ours, processes.raw_pair(fast_alloc=True, **settings) as raw:
        for group in (ours, raw):
            group.wait_ready()
            group.pause()
            calls.measure(group, "cuda_latency", per_round)  # CUDA contexts, IPC handles, streams
        small = calls.take_turns({"nbrpc": (ours, "cuda_latency"), "nbrpc_unwrapped": (ours, "cuda_latency_unwrapped"),
                                  "raw": (raw, "cuda_latency")}, rounds, per_round)
        cpu = calls.take_turns({"nbrpc": (ours, "latency"), "raw": (raw, "latency")}, rounds, per_round)
        big = calls.take_turns({"nbrpc": (ours, "cuda_tensor"), "raw": (raw, "cuda_tensor")},
                               rounds, CUDA_TENSOR_CALLS)
    ms, cpu_ms, big_ms = medians_ms(small), medians_ms(cpu), medians_ms(big)
    note = f"map 0 -> {gpu}; medians of {count(small['nbrpc']):,} calls a side"
    found = [row("cuda_cpu_tensor", cpu_ms["nbrpc"], cpu_ms["raw"], note=note),
             row("cuda_tensor", ms["nbrpc"], ms["raw"], note=note),
             row("cuda_tensor_64", big_ms["nbrpc"], big_ms["raw"], note=f"map 0 -> {gpu}")]
    return found, (f"CUDA calls: {ms['nbrpc'] - ms['nbrpc_unwrapped']:+.3f} ms of the CUDA call in nbrpc's "
                   f"rpc_sync wrapper (torch's own rpc_sync in the nbrpc cluster: {ms['nbrpc_unwrapped']:.3f})")
