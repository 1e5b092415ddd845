"""Big tensors between local members through shared memory: values, copy semantics,
torch's path for the rest, and nothing left after any ending."""

from __future__ import annotations

import ctypes
import os
import struct

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from conftest import wait_until

from nbrpc.wire import shared_tensors

BIG = shared_tensors.MIN_BYTES // 4 * 3  # float32 elements: 3 MiB
TESTS = os.path.dirname(os.path.abspath(__file__))
KEPT: dict[str, torch.Tensor] = {}


def echo(value):
    return value


def keep(name: str, tensor: torch.Tensor) -> bool:
    """On a worker: hold ``tensor``; whether it lies in another member's segment."""
    KEPT[name] = tensor
    return in_segment(tensor)


def ones(n: int) -> torch.Tensor:
    return torch.ones(n)


def full(n: int, value: float) -> torch.Tensor:
    return torch.full((n,), value)


def kept(name: str) -> torch.Tensor:
    return KEPT[name]


def kept_sum(name: str) -> float:
    return KEPT[name].double().sum().item()


def add_to_kept(name: str, value: float) -> None:
    KEPT[name] += value


def drop(name: str) -> None:
    del KEPT[name]


def in_segment(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s memory is a mapped ``nbrpc-tensors`` segment in this process."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            span, *rest = line.split()
            low, high = (int(x, 16) for x in span.split("-"))
            if low <= address < high:
                return "memfd:nbrpc-tensors" in line
    return False


def segments_mapped() -> int:
    """How many ``nbrpc-tensors`` mappings this process has."""
    with open("/proc/self/maps") as f:
        return sum("memfd:nbrpc-tensors" in line for line in f)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool, torch.bfloat16,
                                   torch.complex64, torch.uint8])
def test_big_tensors_arrive_whole_through_a_segment(cluster, dtype):
    sent = (torch.randn(shared_tensors.MIN_BYTES // 2, 2) * 100).to(dtype)  # 1 MiB at least
    back = rpc.rpc_sync("worker1", echo, args=(sent,))
    assert back.dtype == dtype and back.shape == sent.shape and torch.equal(back, sent)
    assert in_segment(back) and back.data_ptr() != sent.data_ptr()


def test_copy_semantics_on_both_sides(cluster):
    sent = torch.ones(BIG)
    assert rpc.rpc_sync("worker1", keep, args=("a", sent))
    sent += 1  # the sender reuses its buffer at once
    assert rpc.rpc_sync("worker1", kept_sum, args=("a",)) == BIG
    rpc.rpc_sync("worker1", add_to_kept, args=("a", 10.0))
    assert sent.sum().item() == 2 * BIG  # the receiver's change stays there
    back = rpc.rpc_sync("worker1", kept, args=("a",))
    assert in_segment(back) and back.sum().item() == 11 * BIG
    back -= 11  # and the driver's copy is its own
    assert rpc.rpc_sync("worker1", kept_sum, args=("a",)) == 11 * BIG
    rpc.rpc_sync("worker1", drop, args=("a",))


def test_a_freed_tensor_gives_its_segment_back(cluster):
    sent = torch.ones(BIG)
    assert torch.equal(rpc.rpc_sync("worker1", echo, args=(sent,)), sent)
    segments, mapped = len(shared_tensors.SHARED.pool.segments), rpc.rpc_sync("worker1", segments_mapped)
    for _ in range(20):
        assert torch.equal(rpc.rpc_sync("worker1", echo, args=(sent,)), sent)
    # the same segments again and again: each side freed what it received
    assert len(shared_tensors.SHARED.pool.segments) == segments
    assert rpc.rpc_sync("worker1", segments_mapped) == mapped


def test_the_rest_keeps_torchs_path(cluster):
    small = torch.ones(16)
    assert not rpc.rpc_sync("worker1", keep, args=("small", small))
    strided = torch.ones(BIG, 2)[:, 0]  # not contiguous
    assert not rpc.rpc_sync("worker1", keep, args=("strided", strided))
    assert rpc.rpc_sync("worker1", kept_sum, args=("strided",)) == BIG
    # a tensor that requires grad keeps torch's path, and its gradient comes back
    weight = torch.full((BIG,), 2.0, requires_grad=True)
    with dist_autograd.context() as context:
        loss = rpc.rpc_sync("worker1", torch.mul, args=(weight, 3.0)).sum()
        dist_autograd.backward(context, [loss])
        grads = dist_autograd.get_gradients(context)
    assert torch.equal(grads[weight], torch.full((BIG,), 3.0))
    for name in ("small", "strided"):
        rpc.rpc_sync("worker1", drop, args=(name,))


def test_workers_send_to_each_other_and_to_the_driver_this_way(cluster):
    held = rpc.remote("worker2", ones, args=(BIG,))
    assert rpc.rpc_sync("worker1", keep, args=("from2", held.to_here()))
    fetched = held.to_here()
    assert in_segment(fetched) and fetched.sum().item() == BIG
    rpc.rpc_sync("worker1", drop, args=("from2",))


ENDINGS_DRIVER = """
import json, os, signal, sys, time
import torch
import torch.distributed.rpc as rpc
import nbrpc
from test_shared_tensors import echo, full, keep, segments_mapped, in_segment
from nbrpc._util import pid_alive
from nbrpc.wire import shared_tensors

BIG = shared_tensors.MIN_BYTES
def report(**kw):
    print(json.dumps(kw), flush=True)

cluster = nbrpc.start(2, progress=None)
report(pids=[w.pid for w in cluster.workers], enabled=shared_tensors.is_enabled())
# worker1 holds a tensor from the driver's segment, then is killed
assert rpc.rpc_sync("worker1", keep, args=("x", torch.ones(BIG)))
os.kill(cluster.workers[0].pid, signal.SIGKILL)
while pid_alive(cluster.workers[0].pid):
    time.sleep(0.05)
# the driver takes that segment back: the next send needs no new one
back = rpc.rpc_sync("worker2", echo, args=(torch.ones(BIG),))
segments = len(shared_tensors.SHARED.pool.segments)
# worker2 sent `back` from its segment; killed, the driver's tensor stays whole
held = rpc.rpc_sync("worker2", full, args=(BIG, 7.0))
os.kill(cluster.workers[1].pid, signal.SIGKILL)
while pid_alive(cluster.workers[1].pid):
    time.sleep(0.05)
report(segments=segments, held=held.sum().item(), in_segment=in_segment(held))
cluster.shutdown()
del back, held
report(mapped=segments_mapped(), pool=len(shared_tensors.SHARED.pool.segments),
       enabled=shared_tensors.is_enabled())
"""


def _memfd_holders(pids) -> list[int]:
    held = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if "memfd:nbrpc-tensors" in f.read():
                    held.append(pid)
        except OSError:
            pass
    return held


def test_killed_receiver_or_sender_leaves_nothing(drivers, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)  # the driver script imports this module
    driver = drivers(ENDINGS_DRIVER)
    started = driver.expect("pids", 120)
    driver.pids.add(*started["pids"])
    assert started["enabled"]
    after = driver.expect("segments", 60)
    assert after["segments"] == 1, after  # reclaimed from the killed receiver
    assert after["held"] == 7.0 * shared_tensors.MIN_BYTES and after["in_segment"]
    ended = driver.expect("mapped", 60)
    assert ended == {"mapped": 0, "pool": 0, "enabled": False}
    assert driver.proc.wait(timeout=60) == 0
    assert wait_until(lambda: not _memfd_holders(started["pids"]), timeout=10)


def test_shutdown_gives_every_segment_back_and_a_driver_can_turn_it_off(drivers, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", TESTS)
    source = """
import json
import torch, torch.distributed.rpc as rpc
import nbrpc
from test_shared_tensors import keep, in_segment
from nbrpc.wire import shared_tensors
c = nbrpc.start(1, progress=None)
used = rpc.rpc_sync("worker1", keep, args=("x", torch.ones(shared_tensors.MIN_BYTES)))
print(json.dumps({"used": used, "enabled": shared_tensors.is_enabled(), "pid": c.workers[0].pid}), flush=True)
c.shutdown()
print(json.dumps({"pool": len(shared_tensors.SHARED.pool.segments)}), flush=True)
"""
    on = drivers(source)
    record = on.expect("used", 120)
    on.pids.add(record["pid"])
    assert record["used"] and record["enabled"] and on.expect("pool", 60) == {"pool": 0}
    assert on.proc.wait(timeout=60) == 0
    monkeypatch.setenv("NBRPC_SHARED_TENSORS", "0")
    off = drivers(source)
    record = off.expect("used", 120)
    off.pids.add(record["pid"])
    assert record == {"used": False, "enabled": False, "pid": record["pid"]}
    assert off.proc.wait(timeout=60) == 0
    assert not _memfd_holders([on.proc.pid, off.proc.pid])


def test_remote_workers_never_get_it():
    """Settings granted to a worker that joins from elsewhere leave the variable out
    (it reads as off there); a local worker's say on when its cluster's do."""
    from nbrpc.settings import SHARED_TENSORS_ENV, WorkerSettings

    local = WorkerSettings("w", 1, "p", b"k", 4, 10.0, shared_tensors=True).for_this_machine(
        "127.0.0.1:1", os.getpid(), "lo")
    assert local.shared_tensors and local.to_env()[SHARED_TENSORS_ENV] == "1"
    assert SHARED_TENSORS_ENV not in local.to_wire()
    assert not WorkerSettings.from_wire(local.to_wire(), "h:1", None).shared_tensors


def test_the_copier_copies_every_byte_in_halves_and_alone():
    """Big copies go in two halves, one on a helper thread; a small one, or one made while
    another has the helper, is one memmove. The helper waits, no CPU, when idle."""
    copier = shared_tensors.Copier()
    for nbytes in (copier.SPLIT_MIN + 3, copier.SPLIT_MIN - 1, 7):
        source = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        target = torch.zeros(nbytes, dtype=torch.uint8)
        copier.copy(target.data_ptr(), source.data_ptr(), nbytes)
        assert torch.equal(target, source), nbytes
    helper = copier.helper
    assert helper is not None and helper.is_alive()
    source = torch.randint(0, 256, (copier.SPLIT_MIN * 2,), dtype=torch.uint8)
    target = torch.zeros_like(source)
    with copier.lock:  # another copy has the helper: this one goes alone, whole
        copier.copy(target.data_ptr(), source.data_ptr(), source.numel())
    assert torch.equal(target, source)
    assert wait_until(lambda: _thread_state(helper.native_id) == "S", timeout=5)
    assert copier.helper is helper


def test_a_mapping_is_faulted_in_and_in_huge_pages_where_the_system_gives_them():
    """Every page resident as it is mapped, in the sender and in a receiver; huge pages
    where the system's policy for shared memory allows them (``never`` is a common default)."""
    size = 8 << 20
    fd = os.memfd_create("nbrpc-test", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        sender = shared_tensors.mapped(fd, size)
        receiver = shared_tensors.mapped(fd, size)
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            policy = f.read().split("[")[1].split("]")[0]
        for mm in (sender, receiver):
            fields = _smaps(mm)
            assert fields["Rss"] == size >> 10, fields
            if policy in ("advise", "within_size", "always", "force"):
                assert fields["ShmemPmdMapped"] >= (size >> 10) - 2048, fields  # all but an unaligned end
        receiver[5] = 7  # one memory: what one side writes, the other reads
        assert sender[5] == 7
        sender.close()
        receiver.close()
    finally:
        os.close(fd)


def _smaps(mm) -> dict[str, int]:
    """The kB fields of ``/proc/self/smaps`` for the mapping ``mm``."""
    view = (ctypes.c_char * 1).from_buffer(mm)
    address = ctypes.addressof(view)
    del view
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        first = line.split(" ", 1)[0]
        if "-" in first and all(c in "0123456789abcdef-" for c in first):
            start, end = (int(x, 16) for x in first.split("-"))
            if start <= address < end:
                fields = {}
                for field in lines[i + 1:]:
                    name, _, rest = field.partition(":")
                    if not rest.strip().endswith("kB"):
                        break
                    fields[name] = int(rest.split()[0])
                return fields
    raise AssertionError(f"no mapping at {address:#x}")


def _thread_state(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_message_dropped_unread_gives_its_segment_back_after_the_lease(monkeypatch):
    """A reply whose caller gave up on it is dropped unread: its segment stays sent until
    the lease, then carries the next message; the late message, unpickled after all,
    raises instead of reading the next one's tensor."""
    pool = shared_tensors.Pool()
    try:
        nbytes = shared_tensors.MIN_BYTES
        first = pool.take(nbytes)
        old = (os.getpid(), first.fd, first.token, first.size, torch.uint8, (nbytes,), first.message)
        assert pool.take(nbytes) is not first  # within the lease it stays the dropped message's
        monkeypatch.setattr(shared_tensors, "SENT_LEASE", 0.0)
        pool.segments[1].mm[0] = shared_tensors.ADOPTED  # the second one's receiver holds it
        struct.pack_into("q", pool.segments[1].mm, 8, os.getpid())
        again = pool.take(nbytes)
        assert again is first and again.message == old[-1] + 1
        first.data[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
        with pytest.raises(RuntimeError, match="arrived more than 0 s after it was sent"):
            shared_tensors.adopt(*old)
        current = shared_tensors.adopt(*old[:-1], again.message)
        assert current[:4].tolist() == [1, 2, 3, 4]
        del current
    finally:
        pool.close()
        shared_tensors.SHARED.mapped.clear()
