"""Tensors go in torch's tensor table under ``tensor_table.receive``, a module function
named by its extension code (three bytes, no import on arrival), and what arrives is what
torch's own receiver gives (values, types, views of one storage, gradients' requirement),
both ways over a real cluster."""

from __future__ import annotations

import pickletools

import torch
from conftest import run
from torch.distributed.rpc import internal

from nbrpc.wire import serialization, shared_tensors, signing, tensor_table


def _serialized(obj) -> tuple[bytes, list]:
    """``obj`` pickled by the member's ``serialize`` (torch's tensor table, not shared memory)."""
    was = shared_tensors.is_enabled()
    shared_tensors.enable(False)
    try:
        return internal._internal_rpc_pickler.serialize(obj)
    finally:
        shared_tensors.enable(was)


def _receivers_named(payload: bytes) -> int:
    """How often a message names ``tensor_table.receive`` (by its extension code)."""
    code = serialization.EXTENSIONS[("nbrpc.wire.tensor_table", "receive")]
    ops = pickletools.genops(payload[signing.HEADER_SIZE:])
    return sum(op.name.startswith("EXT") and arg == code for op, arg, _ in ops)


def test_a_message_names_the_module_receiver_by_its_code_and_puts_each_tensor_in_the_table(cluster):
    base = torch.arange(8.0)
    weight = torch.ones(2, 3)
    view, turned = base[2:5], weight.t()
    payload, tensors = _serialized((base, view, {"weight": weight, "again": base}, [turned]))
    assert _receivers_named(payload) == 4  # (pickle memoizes no code: one a tensor)
    assert b"tensor_table" not in payload and b"_tensor_receiver" not in payload
    # each tensor object once, in pickling order (pickle's memo takes a repeat)
    assert len(tensors) == 4 and all(t is s for t, s in zip(tensors, (base, view, weight, turned)))
    got = internal._internal_rpc_pickler.deserialize(payload, tensors)
    assert got[0] is tensors[0] and got[2]["again"] is got[0] and got[2]["weight"] is tensors[2]
    assert type(got[1]) is torch.Tensor and torch.equal(got[1], base[2:5])


def test_a_reducer_registered_for_tensors_replaces_the_receiver_as_it_replaces_torchs(cluster):
    pickler = internal._internal_rpc_pickler
    seen = []

    def as_list(tensor):
        seen.append(tensor)
        return torch.tensor, (tensor.tolist(),)

    assert tensor_table.reducer(pickler._tensor_reducer) is not pickler._tensor_reducer
    pickler._register_reducer(torch.Tensor, as_list)
    try:
        payload, tensors = _serialized((torch.ones(3),))
        assert len(seen) == 1 and tensors == [] and not _receivers_named(payload)
        assert torch.equal(pickler.deserialize(payload, tensors)[0], torch.ones(3))
    finally:
        del pickler._class_reducer_dict[torch.Tensor]
        pickler._dispatch_table[torch.Tensor] = pickler._tensor_reducer
    payload, tensors = _serialized((torch.ones(3),))
    assert len(seen) == 1 and len(tensors) == 1 and _receivers_named(payload) == 1


def test_tensors_arrive_as_torch_sends_them_both_ways(shell):
    """Values, dtypes, a Parameter, a tensor that requires grad, and views of one storage
    (as views of one storage there), in a call and in its reply."""
    got = run(shell, """
def storages(base, view, named, grad):
    shared = base.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()
    reply = torch.arange(6, dtype=torch.int16)
    return (shared, view.storage_offset(), type(named["p"]).__name__, named["p"].requires_grad,
            grad.requires_grad, base.dtype, view.tolist(), reply, reply[3:])

base = torch.arange(10, dtype=torch.float64)
rpc.rpc_sync("worker1", storages,
             args=(base, base[4:7], {"p": nn.Parameter(torch.ones(2))}, torch.ones(2, requires_grad=True)))
""")
    shared, offset, named_type, named_grad, grad, dtype, view, reply, reply_view = got
    assert shared and offset == 4 and view == [4.0, 5.0, 6.0]
    assert named_type == "Parameter" and named_grad and grad and dtype == torch.float64
    assert reply.dtype == torch.int16 and reply.tolist() == list(range(6))
    assert reply_view.untyped_storage().data_ptr() == reply.untyped_storage().data_ptr()
    assert reply_view.storage_offset() == 3 and type(reply_view) is torch.Tensor


def test_a_big_tensor_beside_small_ones_still_goes_through_shared_memory(shell):
    """The walk that chooses the C route tells whether a message needs shared memory's
    reducer: a big tensor among small ones (in a dict, its view beside it) still takes a
    segment, the small ones torch's table, and views of the big one stay views of it."""
    assert shared_tensors.is_enabled()  # a local cluster's
    big = torch.arange(2**19, dtype=torch.float32)  # 2 MiB, over the 1 MiB default
    message = ({"small": torch.ones(3), "big": big, "part": big[10:]},)  # (a smaller part torch clones)
    payload, tensors = internal._internal_rpc_pickler.serialize(message)
    assert b"shared_tensors" in payload and _receivers_named(payload) == 1
    assert len(tensors) == 1 and torch.equal(tensors[0], torch.ones(3))
    shell.user_ns["sent"] = message[0]
    got = run(shell, """
def views(d):
    same = d["part"].untyped_storage().data_ptr() == d["big"].untyped_storage().data_ptr()
    return same, d["part"].storage_offset(), float(d["big"].sum()), d["small"].tolist()
rpc.rpc_sync("worker1", views, args=(sent,))
""")
    assert got == (True, 10, float(big.sum()), [1.0, 1.0, 1.0]), got
