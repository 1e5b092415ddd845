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


def kept_layout(name: str) -> tuple:
    t = KEPT[name]
    return tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


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
    small = torch.ones(16)  # under the threshold, unless NBRPC_SHARED_TENSORS_MIN_BYTES forces the path
    assert rpc.rpc_sync("worker1", keep, args=("small", small)) == (64 >= shared_tensors.SHARED.min_bytes)
    strided = torch.ones(BIG, 2)[:, 0]  # half its storage: torch sends a contiguous clone, and so does nbrpc
    assert rpc.rpc_sync("worker1", keep, args=("strided", strided))
    assert rpc.rpc_sync("worker1", kept_sum, args=("strided",)) == BIG
    assert rpc.rpc_sync("worker1", kept_layout, args=("strided",)) == ((BIG,), (1,), 0, 4 * BIG)
    conjugate = torch.ones(BIG // 2, dtype=torch.complex64).conj()  # torch's path keeps the bit
    assert not rpc.rpc_sync("worker1", keep, args=("conjugate", conjugate))
    assert rpc.rpc_sync("worker1", kept, args=("conjugate",)).is_conj()
    # a tensor that requires grad keeps torch's path, and its gradient comes back
    weight = torch.full((BIG,), 2.0, requires_grad=True)
    with dist_autograd.context() as context:
        loss = rpc.rpc_sync("worker1", torch.mul, args=(weight, 3.0)).sum()
        dist_autograd.backward(context, [loss])
        grads = dist_autograd.get_gradients(context)
    assert torch.equal(grads[weight], torch.full((BIG,), 3.0))
    for name in ("small", "strided", "conjugate"):
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


@pytest.mark.slow
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


@pytest.mark.slow
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
        old = (os.getpid(), first.fd, first.token, first.size, nbytes, first.message)
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
        assert current.nbytes() == nbytes and list(current[:4]) == [1, 2, 3, 4]
        del current
    finally:
        pool.close()
        shared_tensors.SHARED.mapped.clear()


# -- one message's tensors keep what torch keeps: storages shared among them, offsets, strides


MiB = 1 << 20


def fill_a_sum_b(a, b):
    a.fill_(1.0)
    return b.sum().item()


def zeros_and_its_first_rows():
    z = torch.zeros(1024, 1024)  # 4 MiB
    return z, z[:600]


class Filler:
    def fill_a_sum_b(self, a, b):
        return fill_a_sum_b(a, b)


def test_a_write_through_one_argument_shows_in_another_that_views_its_storage(cluster):
    """The issue's example: raw torch gives 614400.0 through every call form."""
    z = torch.zeros(1024, 1024)
    assert rpc.rpc_sync("worker1", fill_a_sum_b, args=(z, z[:600])) == 614400.0
    assert rpc.rpc_async("worker1", fill_a_sum_b, args=(z, z[:600])).wait() == 614400.0
    assert rpc.remote("worker1", fill_a_sum_b, args=(z, z[:600])).to_here() == 614400.0
    filler = rpc.remote("worker1", Filler)
    assert filler.rpc_sync().fill_a_sum_b(z, z[:600]) == 614400.0
    assert filler.rpc_async().fill_a_sum_b(z, z[:600]).wait() == 614400.0
    assert filler.remote().fill_a_sum_b(z, z[:600]).to_here() == 614400.0
    assert z.sum().item() == 0.0  # the caller's tensor is its own


def test_a_result_of_views_of_one_storage_arrives_as_views_of_one_storage(cluster):
    for arrived in (rpc.rpc_sync("worker1", zeros_and_its_first_rows),
                    rpc.rpc_async("worker1", zeros_and_its_first_rows).wait(),
                    rpc.remote("worker1", zeros_and_its_first_rows).to_here()):
        z, rows = arrived
        assert in_segment(z) and z.untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()
        z.fill_(1.0)
        assert rows.sum().item() == 614400.0


def one_storage():
    base = torch.arange(1 << 21, dtype=torch.float32)  # 8 MiB
    grid = base.view(2048, 1024)
    return [base, grid, grid.t(), base[1000:], grid[:, 1:], grid[:, ::2], base[:100], base[5], base[0:0]]


def memory_formats():
    x = torch.arange(8 * 16 * 64 * 64, dtype=torch.float32).view(8, 16, 64, 64)
    channels_last = x.contiguous(memory_format=torch.channels_last)  # 2 MiB
    return [channels_last, channels_last[:, :, 1:], channels_last[:, ::2], torch.ones(300_000).expand(4, -1)]


def dtypes():
    raw = (torch.arange(4 * MiB) % 251).to(torch.uint8)
    c = torch.complex(torch.arange(MiB, dtype=torch.float32), -torch.arange(MiB, dtype=torch.float32))
    b = torch.arange(MiB).to(torch.bfloat16)
    return [raw, raw.view(torch.bool), raw.view(torch.int32), raw.view(torch.int32)[::3], c, c.real, c[1:],
            b, b[7:], torch.zeros(0), torch.tensor(3.0), (torch.arange(MiB) % 2).bool()]


CASES = {"one storage": one_storage, "memory formats": memory_formats, "dtypes": dtypes}


def made(case: str) -> list:
    return CASES[case]()


def described(tensors: list) -> list:
    """What torch keeps of a message's tensors: dtype, shape, strides, offset, the storage's
    size, which storage (numbered by first use), the values; and whether it lies in a segment."""
    storages: dict[int, int] = {}
    rows = []
    for t in tensors:
        storage = t.untyped_storage()
        which = storages.setdefault(storage.data_ptr(), len(storages))
        values = torch.view_as_real(t) if t.is_complex() else t
        flat = values.reshape(-1).double()
        checksum = (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum().item()
        rows.append({"layout": (str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset(), storage.nbytes(),
                                which, checksum), "in_segment": in_segment(t) if t.numel() else False})
    return rows


def _restarted(members, min_bytes):
    for member in members:
        if member == "driver":
            shared_tensors.enable(True, min_bytes)
        else:
            rpc.rpc_sync(member, shared_tensors.enable, args=(True, min_bytes))


def through_torchs_path(members, send):
    """``send()`` with the shared memory path off in ``members`` ("driver" or a worker's name)."""
    min_bytes = shared_tensors.SHARED.min_bytes
    for member in members:
        if member == "driver":
            shared_tensors.enable(False)
        else:
            rpc.rpc_sync(member, shared_tensors.enable, args=(False,))
    try:
        return send()
    finally:
        _restarted(members, min_bytes)


@pytest.mark.parametrize("case", list(CASES))
def test_arguments_arrive_as_torchs_path_makes_them(cluster, case):
    tensors = made(case)
    ours = rpc.rpc_sync("worker1", described, args=(tensors,))
    torchs = through_torchs_path(["driver"], lambda: rpc.rpc_sync("worker1", described, args=(tensors,)))
    assert [row["layout"] for row in ours] == [row["layout"] for row in torchs]
    assert any(row["in_segment"] for row in ours) and not any(row["in_segment"] for row in torchs)


@pytest.mark.parametrize("case", list(CASES))
def test_results_arrive_as_torchs_path_makes_them(cluster, case):
    ours = described(rpc.rpc_sync("worker2", made, args=(case,)))
    torchs = through_torchs_path(["worker2"], lambda: described(rpc.rpc_sync("worker2", made, args=(case,))))
    assert [row["layout"] for row in ours] == [row["layout"] for row in torchs]
    assert any(row["in_segment"] for row in ours) and not any(row["in_segment"] for row in torchs)


def test_what_torch_clones_arrives_on_a_storage_of_its_own(cluster):
    """torch sends a tensor using under half of a big storage as a clone (``cloneSparseTensors``):
    a write through the whole does not show in it, as under raw torch."""
    z = torch.zeros(1024, 1024)
    assert rpc.rpc_sync("worker1", fill_a_sum_b, args=(z, z[:100])) == 0.0
    rows = rpc.rpc_sync("worker1", described, args=([z, z[:, :100], z[:, ::2]],))
    assert [row["layout"][2:6] for row in rows] == [((1024, 1), 0, 4 * MiB, 0), ((100, 1), 0, 400 * 1024, 1),
                                                     ((512, 1), 0, 2 * MiB, 2)]
    small_clone = 400 * 1024 >= shared_tensors.SHARED.min_bytes  # under the default threshold
    assert [row["in_segment"] for row in rows] == [True, small_clone, True]


def test_the_threshold_can_force_every_tensor_through_shared_memory(cluster):
    """``NBRPC_SHARED_TENSORS_MIN_BYTES`` as a cluster's members take it (``enable``)."""
    min_bytes = shared_tensors.SHARED.min_bytes
    shared_tensors.enable(True, 1)
    try:
        small = torch.arange(10.0)
        rows = rpc.rpc_sync("worker1", described, args=([small, small[2:], torch.tensor(True), torch.zeros(0)],))
        assert [row["in_segment"] for row in rows] == [True, True, True, False]
        assert [row["layout"][3:6] for row in rows] == [(0, 40, 0), (2, 40, 0), (0, 1, 1), (0, 0, 2)]
    finally:
        shared_tensors.enable(True, min_bytes)


def test_the_threshold_setting_travels_to_local_workers_and_is_checked(monkeypatch):
    from nbrpc.settings import SHARED_TENSORS_MIN_BYTES_ENV, WorkerSettings, shared_tensors_min_bytes

    settings = WorkerSettings("w", 1, "p", b"k", 4, 10.0, shared_tensors=True, shared_tensors_min_bytes=1)
    assert WorkerSettings.from_env(settings.to_env()).shared_tensors_min_bytes == 1
    assert SHARED_TENSORS_MIN_BYTES_ENV not in settings.to_wire()
    assert WorkerSettings.from_env(replace_min_bytes(settings, None).to_env()).shared_tensors_min_bytes is None
    monkeypatch.setenv(SHARED_TENSORS_MIN_BYTES_ENV, "4096")
    assert shared_tensors_min_bytes() == 4096
    for bad in ("0", "-3", "1MiB"):
        monkeypatch.setenv(SHARED_TENSORS_MIN_BYTES_ENV, bad)
        with pytest.raises(ValueError, match="NBRPC_SHARED_TENSORS_MIN_BYTES=.*positive number of bytes"):
            shared_tensors_min_bytes()


def replace_min_bytes(settings, value):
    import dataclasses

    return dataclasses.replace(settings, shared_tensors_min_bytes=value)


def test_a_storage_that_a_tensor_requiring_grad_views_stays_on_torchs_path(cluster):
    """Sent first, a tensor that requires grad takes torch's path, and so do the later views
    of its storage in the message: torch sends the storage once, and they stay views of it."""
    weight = torch.zeros(BIG, requires_grad=True)
    with dist_autograd.context():
        rows = rpc.rpc_sync("worker1", described, args=([weight, weight.detach(), weight.detach()[1:]],))
    assert [row["layout"][3:6] for row in rows] == [(0, 4 * BIG, 0), (0, 4 * BIG, 0), (1, 4 * BIG, 0)]
    assert not any(row["in_segment"] for row in rows)


def test_only_dense_cpu_tensors_of_plain_bits_are_eligible():
    """What torch's path must keep goes there: autograd, nested, sparse, quantized tensors,
    and conjugate or negative views (a nested tensor's layout reads as strided)."""
    plain = torch.ones(4, 4)
    assert shared_tensors.eligible(plain) and shared_tensors.eligible(plain.t()[::2])
    complex_ones = torch.ones(4, dtype=torch.complex64)
    with pytest.warns(UserWarning, match="nested tensors is in prototype"):
        nested = torch.nested.nested_tensor([torch.ones(3), torch.ones(2)])  # layout: strided
    with pytest.warns(UserWarning, match="quantized tensor creation functions .* are deprecated"):
        quantized = torch.quantize_per_tensor(plain, 0.1, 0, torch.qint8)
    for kept_by_torch in (torch.ones(4, requires_grad=True), nested, plain.to_sparse(), quantized,
                          complex_ones.conj(), complex_ones.conj().imag):
        assert not shared_tensors.eligible(kept_by_torch), kept_by_torch.layout
