"""Lab 6's checks: federated averaging over client workers, and a deadline for a straggler.

``_Client`` is the checks' own client: its ``train`` answers after a pause of its own
with the global weights shifted by a known offset, and its sample count, so that the
expected average is known exactly; it notes when each call began and ended.
"""

from __future__ import annotations

import time

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn

from ._checking import _call, _Checks, _close, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

_WEIGHTS = ("weight each client's value by its share of the samples, n / sum(counts): "
            "{key: sum(d[key] * n / total for d, n in zip(states, counts)) for key in states[0]}")
_TIMEOUT = ("rpc.*[Tt]imed? ?out|[Tt]imeout|took longer than")


class _Client:
    """A client for the checks: ``train`` returns the weights plus ``offset``, and ``n``."""

    def __init__(self, n, offset, pause=0.3):
        self.n, self.offset, self.pause, self.spans = n, offset, pause, []

    def train(self, weights, round_no):
        began = time.time()
        # One sleep, which a stop request cannot cut short: a late call then ends on its
        # own, quietly, instead of logging its stop in the grader's output.
        time.sleep(self.pause)
        self.spans.append((began, time.time()))
        return {k: v + self.offset for k, v in weights.items()}, self.n

    def call_spans(self):
        return list(self.spans)


def _model():
    with torch.random.fork_rng():  # the caller's random stream stays as it was
        torch.manual_seed(0)
        return nn.Linear(3, 2)


def _states(offsets):
    base = _model().state_dict()
    return [{k: v + o for k, v in base.items()} for o in offsets]


def _average(states, counts):
    total = sum(counts)
    return {k: sum(d[k] * (n / total) for d, n in zip(states, counts)) for k in states[0]}


def _same(got, expected) -> bool:
    return (isinstance(got, dict) and set(got) == set(expected)
            and all(_close(got[k], expected[k]) for k in expected))


@CHECKS.exercise("federated.weighted_average")
def _check_weighted_average(weighted_average) -> str:
    states, counts = _states([0.0, 1.0, 4.0]), [10, 30, 60]
    got = _call(weighted_average, states, counts, what="weighted_average(states, [10, 30, 60])",
                none_hint="return the averaged dict")
    expected = _average(states, counts)
    if not isinstance(got, dict):
        raise _Wrong(f"weighted_average returned {_show(got)}; expected a dict like each state, "
                     "with the same keys", _WEIGHTS)
    if _same(got, _average(states, [1, 1, 1])):
        raise _Wrong("weighted_average gave every client the same weight: the client with 60 "
                     "samples counts as much as the one with 10", _WEIGHTS)
    if _same(got, {k: v * sum(counts) for k, v in expected.items()}):
        raise _Wrong("weighted_average multiplied by the sample counts but did not divide by "
                     "their total: the weights must add up to 1", _WEIGHTS)
    if not _same(got, expected):
        key = next(iter(expected))
        value = got.get(key) if isinstance(got, dict) else got
        raise _Wrong(f"weighted_average gave {key} = {_show(value)}; expected "
                     f"{_show(expected[key])}", _WEIGHTS)
    return "three states with 10, 30 and 60 samples averaged with weights 0.1, 0.3 and 0.6"


def _clients(pauses, counts=(10, 30, 60), offsets=(0.0, 1.0, 4.0)):
    return [rpc.remote(f"client{i}", _Client, args=(n, o, p))
            for i, (n, o, p) in enumerate(zip(counts, offsets, pauses), start=1)]


def _overlapped(spans: list[list[tuple[float, float]]]) -> bool:
    """Whether the clients' calls of the round ran at the same time."""
    last = [s[-1] for s in spans if s]
    return len(last) > 1 and max(b for b, _ in last) < min(e for _, e in last)


@CHECKS.exercise("federated.fedavg_round")
def _check_fedavg_round(fedavg_round) -> str:
    model, clients = _model(), _clients([0.5, 0.5, 0.5])
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _call(fedavg_round, model, clients, 1, what="fedavg_round(model, clients, 1)", returns=False)
    spans = [c.rpc_sync().call_spans() for c in clients]
    missing = [f"client{i}" for i, s in enumerate(spans, start=1) if not s]
    if missing:
        raise _Wrong(f"{', '.join(missing)} never trained in the round",
                     "call train on every client: client.rpc_async().train(weights, round_no)")
    if not _overlapped(spans):
        raise _Wrong("the clients trained one after the other: the round took as long as all "
                     "of them together", "start every client's train with rpc_async first, "
                     "then wait for all the futures")
    now = model.state_dict()
    if _same(now, start):
        raise _Wrong("the server's model did not change after the round",
                     "load the average into the model: model.load_state_dict(average)")
    if _same(now, _average(_states([0.0, 1.0, 4.0]), [1, 1, 1])):
        raise _Wrong("the round averaged the clients without their sample counts", _WEIGHTS)
    if not _same(now, _average(_states([0.0, 1.0, 4.0]), [10, 30, 60])):
        raise _Wrong("the server's model is not the weighted average of the clients' replies",
                     "weighted_average(states, counts) of the (state, n) pairs the clients "
                     "return, then model.load_state_dict")
    return "three clients trained at the same time; the model is their sample-weighted average"


@CHECKS.exercise("federated.round_with_deadline")
def _check_round_with_deadline(round_with_deadline) -> str:
    model, clients = _model(), _clients([0.2, 0.2, 3.0])
    began = time.monotonic()
    kept = _call(round_with_deadline, model, clients, 1, 1.0,
                 what="round_with_deadline(model, clients, 1, deadline=1.0)",
                 none_hint="return how many clients the average took in",
                 hints=[(_TIMEOUT, "a late client's future fails with a timeout: catch the "
                         "error of that future (try: f.wait() except RuntimeError) and average "
                         "the clients that answered")])
    took = time.monotonic() - began
    if took > 2.5:
        raise _Wrong(f"the round took {took:.1f} s: it waited for client3, which takes 3 s, "
                     "past the 1 s deadline", "give each call the deadline: "
                     "client.rpc_async(timeout=deadline).train(weights, round_no)")
    if not _same(model.state_dict(), _average(_states([0.0, 1.0]), [10, 30])):
        raise _Wrong("the model is not the weighted average of client1 and client2, the two "
                     "that answered in time", "average only the replies that came before the "
                     "deadline, weighted by their own counts")
    if kept != 2:
        raise _Wrong(f"the model is right, but round_with_deadline returned {_show(kept)}; "
                     "expected 2, the number of clients averaged", "return len(replies)")
    return "client3 missed the 1 s deadline; the round averaged the other two without it"
