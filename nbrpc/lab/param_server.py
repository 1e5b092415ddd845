"""Lab 3's checks, a parameter server and its trainers, and the lab's data, ``digits``."""

from __future__ import annotations

import functools

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from ._checking import _call, _Checks, _close, _loss_is, _NotDone, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()


def digits():
    """scikit-learn's digits as tensors: ``x_train, y_train, x_test, y_test``.

    Pixels scaled to [0, 1]; a stratified quarter of the images is the test set (the
    split of tutorial 01). Fresh copies each time, loaded once (checks load them too).
    """
    return tuple(t.clone() for t in _digits())


@functools.lru_cache(maxsize=1)
def _digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.25, random_state=0, stratify=data.target)
    x_train, x_test = (torch.tensor(a, dtype=torch.float32) / 16 for a in (x_train, x_test))
    return x_train, torch.tensor(y_train), x_test, torch.tensor(y_test)


def _attr_on_owner(rref, name: str):
    """Runs on the owner of ``rref``: one attribute of the object itself."""
    return getattr(rref.local_value(), name)


def _rrefs_report(parameter_rrefs) -> dict:
    """Runs on ps: call the student's parameter_rrefs on a fresh module, describe the result."""
    module = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    params, got = list(module.parameters()), parameter_rrefs(module)
    if not isinstance(got, (list, tuple)):
        return {"kind": type(got).__name__}
    return {"kind": "list", "n": len(got), "expected": len(params),
            "not_rrefs": [type(r).__name__ for r in got if not isinstance(r, rpc.PyRRef)],
            "same": [isinstance(r, rpc.PyRRef) and r.is_owner() and r.local_value() is p
                     for r, p in zip(got, params)]}


@CHECKS.exercise("param_server.parameter_rrefs")
def _check_parameter_rrefs(parameter_rrefs) -> str:
    report = _call(rpc.rpc_sync, "ps", _rrefs_report, args=(parameter_rrefs,),
                   what="parameter_rrefs(module) on ps")
    wrap = "wrap each parameter itself: [RRef(p) for p in module.parameters()]"
    if report["kind"] == "NoneType":
        raise _NotDone("parameter_rrefs returned None", wrap)
    if report["kind"] != "list":
        raise _Wrong(f"parameter_rrefs returned a {report['kind']}; expected a list with one RRef "
                     "per parameter", wrap)
    if report["n"] != report["expected"]:
        raise _Wrong(f"parameter_rrefs returned {report['n']} items for a module with "
                     f"{report['expected']} parameters", wrap)
    if report["not_rrefs"]:
        raise _Wrong(f"parameter_rrefs returned {report['not_rrefs'][0]} items, not RRefs: a "
                     "tensor sent over RPC arrives as a copy, and an optimizer stepping a copy "
                     "leaves the server's model alone", wrap)
    if not all(report["same"]):
        raise _Wrong("the RRefs hold copies of the parameters, not the parameters themselves",
                     "RRef(p), not RRef(p.detach()) or RRef(p.clone()): the optimizer must "
                     "update the very tensors the model computes with")
    return "one RRef per parameter, owned by ps, holding the parameter itself"


class _Server:
    """A linear digits classifier on ps: the check's own parameter server."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(64, 10)

    def forward(self, x):
        return self.model(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]

    def weights(self):
        return [p.detach().clone() for p in self.model.parameters()]


@CHECKS.exercise("param_server.train_step")
def _check_train_step(train_step) -> str:
    from torch.distributed.optim import DistributedOptimizer

    x_train, y_train, _, _ = digits()
    x, y, lr = x_train[:32], y_train[:32], 0.5
    server = rpc.remote("ps", _Server)
    optimizer = DistributedOptimizer(torch.optim.SGD, server.rpc_sync().parameter_rrefs(), lr=lr)
    local = _Server().model  # the same seed: the server's initial weights
    expected_loss = F.cross_entropy(local(x), y)
    expected_loss.backward()
    expected = [(p - lr * p.grad).detach() for p in local.parameters()]
    loss = _call(train_step, server, optimizer, x, y, what="train_step(server, optimizer, x, y)",
                 none_hint="return the loss: loss.item()")
    now = server.rpc_sync().weights()
    if all(torch.equal(n, p.detach()) for n, p in zip(now, local.parameters())):
        raise _Wrong("the server's weights did not change",
                     "call optimizer.step(context_id) inside the context, after "
                     "dist_autograd.backward(context_id, [loss])")
    if not all(_close(n, e) for n, e in zip(now, expected)):
        raise _Wrong("the server's weights changed, but not by one SGD step on the batch's loss",
                     "loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y); backward and "
                     "step once")
    if not _loss_is(loss, expected_loss.item()):
        raise _Wrong(f"the update is right, but train_step returned {_show(loss)}; expected the "
                     f"batch's loss, {expected_loss.item():.4f}", "return loss.item()")
    return f"one step on 32 digits: loss {float(loss):.4f} and the server's new weights are right"


def _accuracy_on_owner(server_rref, x, y) -> float:
    """Runs on the server's owner: test accuracy of its model."""
    with torch.no_grad():
        return (server_rref.local_value().model(x).argmax(dim=1) == y).float().mean().item()


@CHECKS.exercise("param_server.run_training")
def _check_run_training(run_training, ps, trainers, epochs: int = 3, bar: float = 0.9) -> str:
    names = [t.owner().name for t in trainers]
    spans = [_call(rpc.rpc_sync, n, _attr_on_owner, args=(t, "spans"),
                   what=f"building {n}'s Trainer") for n, t in zip(names, trainers)]
    _call(run_training, trainers, epochs, what=f"run_training(trainers, {epochs})", returns=False)
    new = [rpc.rpc_sync(n, _attr_on_owner, args=(t, "spans"))[len(s):]
           for n, t, s in zip(names, trainers, spans)]
    for name, ran in zip(names, new):
        if len(ran) != epochs:
            raise _Wrong(f"{name} trained {len(ran)} epoch(s) in run_training(trainers, {epochs})",
                         "call train_epoch on every trainer once per epoch")
    if not any(max(b for b, _ in epoch) < min(e for _, e in epoch) for epoch in zip(*new)):
        raise _Wrong("the trainers took turns: no two epochs ran at the same time",
                     "in each epoch, start train_epoch on every trainer with rpc_async "
                     "(trainer.rpc_async().train_epoch()), then wait for all the futures")
    _, _, x_test, y_test = digits()
    accuracy = rpc.rpc_sync(ps.owner(), _accuracy_on_owner, args=(ps, x_test, y_test))
    if accuracy < bar:
        raise _Wrong(f"test accuracy {accuracy:.1%} is below the {bar:.0%} bar",
                     "check train_step (loss, backward, optimizer.step) and run every epoch")
    return (f"{', '.join(names)} trained at the same time; test accuracy {accuracy:.1%} "
            f"(bar: {bar:.0%})")


# -- exercise 4: reading a timeline ------------------------------------------------------


def _call_record(n: int, callee: str, began, ended, caller: str = "master") -> dict:
    """A CallRecord (``nbrpc.schemas``) of the check's own made-up traces."""
    return {"id": f"{caller}:{n}", "caller": caller, "callee": callee, "kind": "rpc_sync",
            "name": "ParameterServer.forward" if callee == "ps" else "Trainer.train_epoch",
            "sent": (began if began is not None else 0.0) - 0.01, "began": began, "ended": ended,
            "replied": ended + 0.01 if ended is not None else None, "thread": None,
            "request": {"tensor": 0, "pickle": 100}, "reply": None, "parent": None,
            "context": None, "rref": None, "error": None}


def _trace(*calls) -> dict:
    return {"workers": [{"name": n, "id": i, "host": "127.0.0.1", "pid": 0}
                        for i, n in enumerate(["master", "ps", "trainer1", "trainer2"])],
            "calls": [_call_record(k, *c) for k, c in enumerate(calls)],
            "clocks": [], "start": 0.0, "end": 10.0, "dropped": 0}


# The first trace holds a call whose callee's part was not recorded; trainer2's two calls
# overlap by 1 s. In the second, trainer1 runs three calls at once (6 s of calls in 3 s)
# and ps one call of 3.5 s: ps is busier.
_BUSIEST = [
    (_trace(("trainer2", 1.0, 5.0), ("trainer2", 4.0, 6.0), ("ps", 0.0, 4.5),
            ("trainer1", None, None)), "trainer2", 0.5),
    (_trace(("trainer1", 0.0, 2.0), ("trainer1", 0.5, 2.5), ("trainer1", 1.0, 3.0),
            ("ps", 3.0, 6.5), ("trainer2", 7.0, 8.0)), "ps", 0.35),
]
_OVERLAPS = ("overlapping calls count once: sort a worker's (began, ended) intervals and merge "
             "those that overlap before adding them up")


def _summed(snapshot: dict) -> tuple[str, float]:
    """The answer if overlapping calls counted twice (the usual slip)."""
    total: dict[str, float] = {}
    for c in snapshot["calls"]:
        if c["began"] is not None:
            total[c["callee"]] = total.get(c["callee"], 0.0) + c["ended"] - c["began"]
    worker = max(total, key=total.get)
    return worker, total[worker] / (snapshot["end"] - snapshot["start"])


@CHECKS.exercise("param_server.busiest")
def _check_busiest(busiest) -> str:
    for snapshot, name, share in _BUSIEST:
        got = _call(busiest, snapshot, what="busiest(snapshot)",
                    none_hint="return a pair: (worker, share)")
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise _Wrong(f"busiest returned {_show(got)}; expected a pair (worker, share)",
                         "return worker, busy / (snapshot['end'] - snapshot['start'])")
        worker, fraction = got
        if worker != name:
            if worker == _summed(snapshot)[0]:
                raise _Wrong(f"busiest named {worker}, whose calls overlap: it ran several at "
                             f"once, and is not busier than {name}", _OVERLAPS)
            raise _Wrong(f"busiest named {_show(worker)}; the busiest worker is {name}",
                         "add up, per callee, the time from began to ended of its calls, "
                         "overlapping calls counted once")
        if isinstance(fraction, (int, float)) and abs(fraction - _summed(snapshot)[1]) < 1e-6:
            raise _Wrong(f"busiest gave {name} a share of {fraction:g}, counting its overlapping "
                         f"calls twice; expected {share:g}", _OVERLAPS)
        if not isinstance(fraction, (int, float)) or abs(fraction - share) > 1e-6:
            raise _Wrong(f"busiest named {name} rightly, with a share of {_show(fraction)}; "
                         f"expected {share:g}",
                         "the share is the busy time over the window: "
                         "snapshot['end'] - snapshot['start']")
    return ("trainer2 and ps are the busiest in the check's two traces, overlapping calls "
            "counted once, calls without a callee part skipped")
