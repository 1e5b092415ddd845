"""Distributed autograd snapshots on a real cluster: exact graphs, gradients, recording."""

from __future__ import annotations

import collections
import sys

import cloudpickle
import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.optim import DistributedOptimizer

import nbrpc
from nbrpc.diagnostics import autograd

# Workers cannot import this file: its classes travel by value, like a notebook's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Stage(torch.nn.Module):
    def __init__(self, inputs, outputs, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = torch.nn.Linear(inputs, outputs)

    def forward(self, x):
        return self.fc(x)


def forward(stage, x):
    return stage.local_value()(x)


def parameter_rrefs(stage):
    return [rpc.RRef(p) for p in stage.local_value().parameters()]


def parameters(stage):
    return [p.detach().clone() for p in stage.local_value().parameters()]


@pytest.fixture(scope="module")
def stages(cluster):
    held = [rpc.remote("worker1", Stage, args=(3, 2, 1)), rpc.remote("worker2", Stage, args=(2, 1, 2))]
    yield held
    held.clear()  # delete the RRefs while their owners still run


def two_stage_loss(stages, x):
    h1 = rpc.rpc_sync("worker1", forward, args=(stages[0], x))
    h2 = rpc.rpc_sync("worker2", forward, args=(stages[1], h1))
    return h2.sum()


def label(node):
    return (node["worker"], node["name"], node.get("param"))


def edge_labels(snapshot):
    nodes = {n["id"]: label(n) for n in snapshot["nodes"]}
    return collections.Counter((nodes[e["src"]], nodes[e["dst"]], e["kind"]) for e in snapshot["edges"])


M, W1, W2 = "master", "worker1", "worker2"
SEND, RECV, ADDMM, T, ACC = "SendRpcBackward", "RecvRpcBackward", "AddmmBackward0", "TBackward0", "AccumulateGrad"
STAGE_EDGES = {
    # worker1's stage: x needs no gradient, so no recv there
    ((W1, SEND, None), (W1, ADDMM, None), "local"): 1,
    ((W1, ADDMM, None), (W1, ACC, "fc.bias"), "local"): 1,
    ((W1, ADDMM, None), (W1, T, None), "local"): 1,
    ((W1, T, None), (W1, ACC, "fc.weight"), "local"): 1,
    ((W2, SEND, None), (W2, ADDMM, None), "local"): 1,
    ((W2, ADDMM, None), (W2, ACC, "fc.bias"), "local"): 1,
    ((W2, ADDMM, None), (W2, RECV, None), "local"): 1,
    ((W2, ADDMM, None), (W2, T, None), "local"): 1,
    ((W2, T, None), (W2, ACC, "fc.weight"), "local"): 1,
    # the driver forwards h1 from worker1 to worker2
    ((M, SEND, None), (M, RECV, None), "local"): 1,
    # gradients cross back: driver -> worker2 -> driver -> worker1
    ((M, RECV, None), (W2, SEND, None), "rpc"): 1,
    ((W2, RECV, None), (M, SEND, None), "rpc"): 1,
    ((M, RECV, None), (W1, SEND, None), "rpc"): 1,
}


def test_graph_of_a_two_worker_forward(stages):
    x = torch.randn(4, 3)
    with dist_autograd.context() as context_id:
        loss = two_stage_loss(stages, x)
        without_roots = nbrpc.autograd_snapshot(context_id)
        snap = nbrpc.autograd_snapshot(context_id, roots=[loss])
    assert snap["context_id"] == context_id
    assert snap["workers"] == [M, W1, W2]
    assert edge_labels(without_roots) == STAGE_EDGES
    assert edge_labels(snap) == {**STAGE_EDGES, ((M, "SumBackward0", None), (M, RECV, None), "local"): 1}
    assert collections.Counter(label(n) for n in snap["nodes"]) == collections.Counter([
        (M, "SumBackward0", None), (M, RECV, None), (M, RECV, None), (M, SEND, None),
        (W1, SEND, None), (W1, ADDMM, None), (W1, T, None), (W1, ACC, "fc.weight"),
        (W1, ACC, "fc.bias"), (W2, SEND, None), (W2, RECV, None), (W2, ADDMM, None),
        (W2, T, None), (W2, ACC, "fc.weight"), (W2, ACC, "fc.bias")])
    assert len({n["id"] for n in snap["nodes"]}) == len(snap["nodes"])
    for e in snap["edges"]:
        if e["kind"] == "rpc":  # the message id's top 16 bits name the sender
            send = next(n for n in snap["nodes"] if n["id"] == e["dst"])
            recv = next(n for n in snap["nodes"] if n["id"] == e["src"])
            assert send["message_id"] == recv["message_id"]
            sender = send["message_id"] >> 48
            assert rpc.get_worker_info(send["worker"]).id == sender
    assert snap["gradients"] == []


def test_gradients_and_optimizer_step_after_backward(stages):
    x = torch.randn(4, 3)
    before = [rpc.rpc_sync(w, parameters, args=(s,)) for w, s in zip((W1, W2), stages)]
    # The same computation, locally, gives the gradients to expect.
    local = [[p.clone().requires_grad_() for p in ps] for ps in before]
    h = x @ local[0][0].T + local[0][1]
    (h @ local[1][0].T + local[1][1]).sum().backward()

    params = sum((rpc.rpc_sync(w, parameter_rrefs, args=(s,)) for w, s in zip((W1, W2), stages)), [])
    optimizer = DistributedOptimizer(torch.optim.SGD, params, lr=0.5)
    nbrpc.record_autograd()
    try:
        with dist_autograd.context() as context_id:
            dist_autograd.backward(context_id, [two_stage_loss(stages, x)])
            optimizer.step(context_id)
    finally:
        nbrpc.record_autograd(False)
    snap = nbrpc.autograd_snapshot(context_id)  # the block has exited: the recording
    assert snap is nbrpc.last_recorded()
    grads = {(g["worker"], g["param"]): g for g in snap["gradients"]}
    expected = {(W1, "fc.weight"): local[0][0], (W1, "fc.bias"): local[0][1],
                (W2, "fc.weight"): local[1][0], (W2, "fc.bias"): local[1][1]}
    assert set(grads) == set(expected)
    for key, tensor in expected.items():
        assert grads[key]["shape"] == list(tensor.shape)
        assert grads[key]["norm"] == pytest.approx(tensor.grad.norm().item(), rel=1e-4)
    assert ((M, "SumBackward0", None), (M, RECV, None), "local") in edge_labels(snap)

    after = [rpc.rpc_sync(w, parameters, args=(s,)) for w, s in zip((W1, W2), stages)]
    for old, new, grad in zip(sum(before, []), sum(after, []), sum(local, [])):
        assert torch.allclose(new, old - 0.5 * grad.grad, atol=1e-6)


def _made_on_worker() -> tuple[int, int]:
    """(the creator torch_compat reads from a context made here, this worker's id)."""
    from nbrpc._compat import torch_compat

    with dist_autograd.context() as context_id:
        return torch_compat.context_creator(context_id), rpc.get_worker_info().id


def test_context_gone_after_its_block_is_a_clear_error(stages):
    creator, worker_id = rpc.rpc_sync(W2, _made_on_worker)
    assert creator == worker_id == rpc.get_worker_info(W2).id != 0
    with dist_autograd.context() as context_id:
        two_stage_loss(stages, torch.randn(2, 3))
    # At once, though the workers may still be dropping their parts of the context.
    with pytest.raises(nbrpc.AutogradContextError) as info:
        nbrpc.autograd_snapshot(context_id)
    message = str(info.value)
    assert f"no distributed autograd context {context_id} exists" in message
    assert "nbrpc.record_autograd()" in message


def test_join_pairs_sends_and_recvs_by_message_id():
    def piece(name, wid, nodes):
        return dict(name=name, id=wid, nodes=nodes, edges=[], gradients=[])

    snap = autograd.join(7, [
        piece("a", 0, [dict(id="a:0", worker="a", name=RECV, message_id=1 << 48),
                       dict(id="a:1", worker="a", name=SEND, message_id=5)]),
        piece("b", 1, [dict(id="b:0", worker="b", name=SEND, message_id=1 << 48),
                       dict(id="b:1", worker="b", name=RECV, message_id=5),
                       dict(id="b:2", worker="b", name=RECV, message_id=9)]),  # sender not here
    ])
    assert snap["workers"] == ["a", "b"]
    assert snap["edges"] == [dict(src="a:0", dst="b:0", kind="rpc"), dict(src="b:1", dst="a:1", kind="rpc")]


def test_members_without_functions_are_left_out(stages):
    with dist_autograd.context() as context_id:
        rpc.rpc_sync("worker1", forward, args=(stages[0], torch.randn(2, 3)))
        first = nbrpc.autograd_snapshot(context_id)
        # the first snapshot's calls carried the context to worker2 as well
        again = nbrpc.autograd_snapshot(context_id)
    assert first["workers"] == again["workers"] == [M, W1]
    assert {n["worker"] for n in again["nodes"]} == {M, W1}


def add(a, b):
    return a + b


def test_to_here_keeps_the_autograd_context(cluster):
    """to_here on the main thread inside a context records its reply, as torch's does:
    the value has the recv function, and backward reaches the owner."""
    t1, t2 = torch.ones(2, 2, requires_grad=True), torch.zeros(2, 2, requires_grad=True)
    with dist_autograd.context() as context_id:
        value = rpc.remote("worker1", add, args=(t1, t2)).to_here()
        context = dist_autograd._current_context()
        assert value.grad_fn is not None and value.grad_fn.name() == "torch::distributed::autograd::RecvRpcBackward"
        assert (len(context._send_functions()), len(context._recv_functions())) == (1, 1)  # as torch
        dist_autograd.backward(context_id, [value.sum()])
        grads = dist_autograd.get_gradients(context_id)
        assert torch.equal(grads[t1], torch.ones(2, 2)) and torch.equal(grads[t2], torch.ones(2, 2))

