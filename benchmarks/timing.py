"""The timing loops, shared by the nbrpc side and the raw torch side.

Both sides run exactly this code and call through the module attribute
``torch.distributed.rpc.rpc_sync`` as a user would: in an nbrpc member that is
nbrpc's wrapper, in a raw member torch's own function.
"""

from __future__ import annotations

import collections
import time

import rpc_functions
import torch
import torch.distributed.rpc as rpc
from rpc_functions import echo
from torch.distributed.rpc import internal

TENSOR_MB = 100
CUDA_TENSOR_MB = 64
SMALL_ARG = 1
# Untimed calls before each measurement: a pair just resumed from SIGSTOP answers its
# first calls slowly, and on a busy machine its first 100 MB trip after a pause can
# take several times as long as the next one.
WAKE_UP_CALLS = 20
WAKE_UP_TRIPS = 1
# What the "cell_*" measurements call: here the importable functions (what a script
# calls, and what the raw pair calls); the nbrpc driver puts in the same code defined
# in its ``__main__``, as a notebook cell defines it.
CELL = {"echo": rpc_functions.echo, "scaled": rpc_functions.scaled}


def sync_latencies(to: str, calls: int, rpc_sync=None, value=SMALL_ARG, func=echo) -> list[float]:
    """Seconds taken by each of ``calls`` small ``rpc_sync`` calls echoing ``value``, one
    at a time.

    ``rpc_sync`` replaces the public function, to time one layer of nbrpc at a time.
    """
    rpc_sync = rpc_sync or rpc.rpc_sync
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rpc_sync(to, func, args=(value,))
        samples.append(time.perf_counter() - began)
    return samples


def async_latencies(to: str, calls: int, func=echo) -> list[float]:
    """Seconds taken by each small ``rpc_async`` and its ``wait()``, one at a time."""
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rpc.rpc_async(to, func, args=(SMALL_ARG,)).wait()
        samples.append(time.perf_counter() - began)
    return samples


def call_bytes(func, wrap=None) -> int:
    """Bytes of the pickle a small call of ``func`` sends (tensors apart: there are none),
    with this process's RPC pickler; ``wrap`` gives what the caller really sends."""
    udf = internal.PythonUDF(wrap(func) if wrap else func, (SMALL_ARG,), {})
    payload, _tensors = internal._internal_rpc_pickler.serialize(udf)
    return len(payload)


def cuda_latencies(to: str, calls: int, rpc_sync=None, elements: int = SMALL_ARG) -> list[float]:
    """Seconds taken by each ``rpc_sync`` echoing a float CUDA tensor of ``elements`` sent
    from ``cuda:0`` through the device map, until the reply's tensor is ready on ``cuda:0``
    (the call's stream synchronized), once it is seen to come back there (the reply's
    inverse map)."""
    rpc_sync = rpc_sync or rpc.rpc_sync
    tensor = torch.ones(elements, device="cuda:0")
    returned = rpc_sync(to, echo, args=(tensor,))
    if returned.device != tensor.device or returned.numel() != elements:
        raise RuntimeError(f"{to} returned {returned.numel()} elements on {returned.device}, "
                           f"sent {elements} on {tensor.device}")
    stream = torch.cuda.current_stream(tensor.device)
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rpc_sync(to, echo, args=(tensor,))
        stream.synchronize()
        samples.append(time.perf_counter() - began)
    return samples


def remote_latencies(to: str, calls: int, func=echo) -> list[float]:
    """Seconds taken by each small ``rpc.remote`` plus ``to_here``, the RRef then deleted
    (with nbrpc's tracking on, every step of an RRef's life is recorded)."""
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rpc.remote(to, func, args=(SMALL_ARG,)).to_here()
        samples.append(time.perf_counter() - began)
    return samples


def local_rref_lives(calls: int) -> list[float]:
    """Seconds taken by each ``RRef(value)`` created and deleted here: no message is
    sent, so this is the CPU cost of RRef tracking alone (next to raw torch)."""
    value = torch.zeros(1)
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        rref = rpc.RRef(value)
        del rref
        samples.append(time.perf_counter() - began)
    return samples


def async_throughput(to: str, calls: int, in_flight: int) -> float:
    """Small ``rpc_async`` calls per second with up to ``in_flight`` outstanding."""
    pending = collections.deque()
    began = time.perf_counter()
    for _ in range(calls):
        if len(pending) >= in_flight:
            pending.popleft().wait()
        pending.append(rpc.rpc_async(to, echo, args=(SMALL_ARG,)))
    while pending:
        pending.popleft().wait()
    return calls / (time.perf_counter() - began)


def copy_seconds(copies: int, megabytes: int = TENSOR_MB) -> list[float]:
    """Seconds of each copy of a float tensor into a buffer in use (faulted in): the
    memcpy a round trip through shared memory makes twice."""
    source = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)
    samples = []
    for _ in range(copies):
        began = time.perf_counter()
        target.copy_(source)
        samples.append(time.perf_counter() - began)
    return samples


def tensor_round_trips(to: str, trips: int, megabytes: int = TENSOR_MB) -> list[float]:
    """Seconds taken by each ``rpc_sync`` that sends a float tensor and gets it back."""
    tensor = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    samples = []
    for _ in range(trips):
        began = time.perf_counter()
        returned = rpc.rpc_sync(to, echo, args=(tensor,))
        samples.append(time.perf_counter() - began)
        if returned.numel() != tensor.numel():
            raise RuntimeError(f"{to} returned {returned.numel()} elements, sent {tensor.numel()}")
        del returned
    return samples


def measure(to: str, op: str, count: int, in_flight: int = 32, rpc_sync=None):
    """Run the measurement named ``op`` (a command from the benchmark) after a wake-up."""
    sync_latencies(to, WAKE_UP_CALLS, rpc_sync)
    if op == "latency":
        return sync_latencies(to, count, rpc_sync)
    if op == "cuda_latency":
        cuda_latencies(to, WAKE_UP_CALLS, rpc_sync)
        return cuda_latencies(to, count, rpc_sync)
    if op == "cuda_tensor":
        elements = CUDA_TENSOR_MB * 2**20 // 4
        cuda_latencies(to, WAKE_UP_TRIPS, rpc_sync, elements)
        return cuda_latencies(to, count, rpc_sync, elements)
    if op == "remote":
        return remote_latencies(to, count)
    if op == "cell_bytes":  # after calls of each, so what is sent is the steady state
        return {name: call_bytes(func) for name, func in CELL.items()}
    if op == "cell_sync":
        return sync_latencies(to, count, func=CELL["echo"])
    if op == "cell_globals":
        return sync_latencies(to, count, func=CELL["scaled"])
    if op == "cell_async":
        return async_latencies(to, count, CELL["echo"])
    if op == "cell_remote":
        return remote_latencies(to, count, CELL["echo"])
    if op == "local_rref":
        return local_rref_lives(count)
    if op == "throughput":
        return async_throughput(to, count, in_flight)
    if op == "tensor":
        tensor_round_trips(to, WAKE_UP_TRIPS)
        return tensor_round_trips(to, count)
    raise ValueError(f"unknown measurement {op!r}: use latency, cuda_latency, cuda_tensor, remote, local_rref, "
                     "throughput, tensor, cell_sync, cell_globals, cell_async or cell_remote")
