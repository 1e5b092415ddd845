"""Lab 8's checks: hybrid parallelism, a sparse table on ps and a dense layer under DDP.

Parts:

- ``_Table``: the checks' own sparse part, a seeded ``nn.EmbeddingBag`` that notes whether
  each call came inside a distributed autograd context, with ``parameter_rrefs`` as the
  lab's own table has. Its gradients are sparse: the two trainers step the table on ps at
  the same time, and a dense step rewrites every row, so one trainer's step could undo the
  other's; a sparse step writes only the rows its bags used.
- ``_batches``: the checks' bags for each trainer, drawn from rows of its own, so that the
  two trainers' updates of the table never meet and the expected weights are exact
  (``_expected``: the steps computed here, with the dense gradients averaged as DDP does).
- ``_on_trainers`` runs the student's ``train`` on trainer0 and trainer1 at once (DDP's
  collectives need both), each with a dense layer of the checks' own (``_train_here``), in
  a process group formed afresh for the run (``_join_group``).
- ``ddp_port``: a free port for the trainers' process group, for the notebook's first cells.
"""

from __future__ import annotations

import datetime
import traceback

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from .._util import unused_loopback_port
from ._checking import _call, _Checks, _close, _loss_is, _show, _Wrong
from .rnn import _in_context, _owned_report, _seeded

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

_ROWS, _WIDTH, _CLASSES, _STEPS = 20, 4, 3, 3
_TRAINERS = ("trainer0", "trainer1")
# Seconds a check waits for the trainers; a collective of theirs gives up sooner, when one
# trainer failed and the other waits for it.
_WAIT, _COLLECTIVE = 60, 10
_REMOTE = ("look the bags up on the table's owner through its RRef, "
           "emb_rref.rpc_sync().forward(indices, offsets), then apply fc here")
_STEP = ("one dist_autograd context per batch: hybrid_forward, F.cross_entropy(output, target), "
         "dist_autograd.backward(context_id, [loss]), optimizer.step(context_id)")


def ddp_port() -> int:
    """A free loopback port for the trainers' process group, where none of the cluster's own
    sockets (bound to port 0) can take it before the group binds it."""
    return unused_loopback_port()


class _Table(nn.Module):
    """The sparse part for the checks: a seeded EmbeddingBag that logs its calls."""

    def __init__(self):
        super().__init__()
        self.bag = _seeded(1, lambda: nn.EmbeddingBag(_ROWS, _WIDTH, mode="sum", sparse=True))
        self.calls = []

    def forward(self, indices, offsets):
        self.calls.append(_in_context())
        return self.bag(indices, offsets)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def call_log(self):
        return list(self.calls)

    def weights(self):
        return [p.detach().clone() for p in self.parameters()]


def _dense():
    return _seeded(2, lambda: nn.Linear(_WIDTH, _CLASSES))


def _batch(seed, low, high, bags=4):
    """Bags of 1 to 3 rows in [low, high), their offsets, and a class for each bag."""
    generator = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 4, (bags,), generator=generator)
    indices = torch.randint(low, high, (int(sizes.sum()),), generator=generator)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)[:-1]])
    return indices, offsets, torch.randint(0, _CLASSES, (bags,), generator=generator)


def _batches(rank):
    half = _ROWS // 2
    return [_batch(10 * rank + step, rank * half, (rank + 1) * half) for step in range(_STEPS)]


@CHECKS.exercise("hybrid.hybrid_forward")
def _check_hybrid_forward(hybrid_forward) -> str:
    table, here, fc = rpc.remote("ps", _Table), _Table(), _dense()
    indices, offsets, _ = _batch(5, 0, _ROWS)
    got = _call(hybrid_forward, table, fc, indices, offsets,
                what="hybrid_forward(emb_rref, fc, indices, offsets)",
                none_hint="return the dense layer's output")
    if not table.rpc_sync().call_log():
        raise _Wrong("the embedding table never ran on ps: to_here() fetched a copy and looked "
                     "the bags up here, where no gradient reaches the server's table", _REMOTE)
    expected = fc(here(indices, offsets)).detach()
    if not _close(got, expected):
        raise _Wrong(f"the output is {_show(got)}; fc(table(indices, offsets)) is "
                     f"{_show(expected)}", _REMOTE)
    return "the bags were looked up on ps and the dense layer ran here; the output is right"


@CHECKS.exercise("hybrid.parameter_rrefs")
def _check_parameter_rrefs(parameter_rrefs) -> str:
    table, fc = rpc.remote("ps", _Table), _dense()
    got = _call(parameter_rrefs, table, fc, what="parameter_rrefs(emb_rref, fc)",
                none_hint="return the list of parameter RRefs")
    if not isinstance(got, (list, tuple)) or not all(isinstance(r, rpc.PyRRef) for r in got):
        raise _Wrong(f"parameter_rrefs returned {_show(got)}; expected a list of RRefs",
                     "emb_rref.rpc_sync().parameter_rrefs() + [RRef(p) for p in fc.parameters()]")
    here = [r for r in got if r.is_owner()]
    report = rpc.rpc_sync("ps", _owned_report, args=(list(got), table))
    if report["ps"] and not here:
        raise _Wrong("the RRefs cover the embedding table only: DistributedOptimizer would "
                     "never step the dense layer", "add [RRef(p) for p in fc.parameters()]")
    if report["ps"] != 1 or report["same"] != 1:
        raise _Wrong(f"ps owns {report['ps']} of the RRefs; expected 1, holding the table's "
                     "weight itself (RRefs made here, of a copy, do not reach it)",
                     "ask the table on ps for them: emb_rref.rpc_sync().parameter_rrefs()")
    own = list(fc.parameters())
    if len(here) != len(own) or not all(any(r.local_value() is p for p in own) for r in here):
        raise _Wrong(f"master owns {len(here)} of the RRefs; expected {len(own)}, holding the "
                     "dense layer's weight and bias themselves",
                     "add [RRef(p) for p in fc.parameters()]")
    return "1 RRef owned by ps (the table's weight) and 2 here (the dense layer's weight and bias)"


def _train_here(train, emb_rref, batches, lr):
    """Runs on a trainer: the student's ``train`` with the checks' dense layer; its result.

    An error comes back as its text, worded as torch words a remote error: raised, it would
    also be printed by the worker, a traceback above the check's ✗ line.
    """
    dense = _dense()
    try:
        losses = train(emb_rref, dense, batches, lr)
    except Exception as e:
        info = rpc.get_worker_info()
        return f"On WorkerInfo(id={info.id}, name={info.name}):\n{e!r}\n{traceback.format_exc()}"
    return losses, [p.detach().clone() for p in dense.parameters()]


def _join_group(rank, port):
    """Runs on a trainer: a fresh gloo group of the two trainers, instead of the current one.

    A collective that failed on one trainer (a student's mistake) leaves the other waiting,
    then the group broken for good: each check runs in a group of its own.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("gloo", rank=rank, world_size=len(_TRAINERS),
                            init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=_COLLECTIVE))


def _on_trainers(train, table, lr):
    """``train`` on both trainers at once; every trainer's answer, or the first error."""
    port = ddp_port()
    for future in [rpc.rpc_async(name, _join_group, args=(rank, port), timeout=_WAIT)
                   for rank, name in enumerate(_TRAINERS)]:
        future.wait()
    futures = [rpc.rpc_async(name, _train_here, args=(train, table, _batches(rank), lr),
                             timeout=_WAIT) for rank, name in enumerate(_TRAINERS)]
    torch.futures.collect_all(futures).wait()  # both finish (or fail) before anything is read
    answers = [f.wait() for f in futures]
    failed = [a for a in answers if isinstance(a, str)]
    if failed:
        raise RuntimeError(failed[0])
    return answers


def _expected(lr):
    """The table's and the dense layer's weights after the steps, and each trainer's losses."""
    table, dense, losses = _Table(), _dense(), [[], []]
    for step in range(_STEPS):
        dense_grads = []
        for rank in (0, 1):
            indices, offsets, target = _batches(rank)[step]
            table.zero_grad()
            dense.zero_grad()
            loss = F.cross_entropy(dense(table(indices, offsets)), target)
            loss.backward()
            losses[rank].append(loss.item())
            dense_grads.append([p.grad.clone() for p in dense.parameters()])
            with torch.no_grad():  # each trainer steps its own rows of the table
                table.bag.weight -= lr * table.bag.weight.grad
        with torch.no_grad():
            for p, g0, g1 in zip(dense.parameters(), *dense_grads):
                p -= lr * (g0 + g1) / 2
    return table.weights(), [p.detach() for p in dense.parameters()], losses


def _same(got, expected) -> bool:
    return len(got) == len(expected) and all(_close(a, b) for a, b in zip(got, expected))


def _check_group() -> None:
    for name in _TRAINERS:
        if not rpc.rpc_sync(name, dist.is_initialized):
            raise _Wrong(f"{name} has no process group for DDP yet",
                         "run the %%rpc_on trainer0,trainer1 cell that calls "
                         "dist.init_process_group, then this check")


def _run_train(train, table, lr):
    try:
        return _call(_on_trainers, train, table, lr, what="train(emb_rref, dense, batches, lr)",
                     none_hint="return the list of losses")
    except _Wrong as e:
        if "graphTask_ INTERNAL ASSERT" not in e.message:
            raise
        raise _Wrong("train called loss.backward(): the local backward pass cannot follow the "
                     "lookup's RPC back to the table on ps",
                     "use dist_autograd.backward(context_id, [loss]) inside the context") from None


@CHECKS.exercise("hybrid.train")
def _check_train(train) -> str:
    _check_group()
    table, lr = rpc.remote("ps", _Table), 0.5
    expected_table, expected_dense, expected_losses = _expected(lr)
    (losses0, dense0), (losses1, dense1) = _run_train(train, table, lr)
    if not any(table.rpc_sync().call_log()):
        raise _Wrong("the forward pass ran outside a dist_autograd context: no gradient could "
                     "reach the table on ps", "run each batch inside `with "
                     "dist_autograd.context() as context_id:`")
    start = list(_dense().parameters())
    if _same(dense0, start) and _same(dense1, start):
        raise _Wrong("the dense layer did not change on either trainer: the optimizer never "
                     "stepped it", "give DistributedOptimizer the dense layer's RRefs too: "
                     "parameter_rrefs(emb_rref, fc)")
    if not _same(dense0, dense1):
        raise _Wrong(f"after {_STEPS} steps the trainers' dense layers differ ({_show(dense0[0])} "
                     f"on trainer0, {_show(dense1[0])} on trainer1): each replica learned from "
                     "its own batches only", "wrap the dense layer in DDP, fc = DDP(dense), and "
                     "use fc in the forward pass: backward then averages its gradients")
    if not (_same(table.rpc_sync().weights(), expected_table) and _same(dense0, expected_dense)):
        raise _Wrong(f"the weights are not those of {_STEPS} SGD steps with DDP's averaged "
                     "gradients", _STEP)
    for got, expected in ((losses0, expected_losses[0]), (losses1, expected_losses[1])):
        if not (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(_loss_is(g, e) for g, e in zip(got, expected))):
            raise _Wrong(f"the weights are right, but train returned {_show(got)}; expected "
                         f"the {_STEPS} losses", "losses.append(loss.item()); return losses")
    return (f"{_STEPS} steps on both trainers: the dense replicas agree and the table on ps "
            "moved, exactly as SGD with DDP's averaged gradients")
