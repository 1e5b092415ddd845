"""Lab 7's checks: the distributed RNN, its embedding and decoder on a parameter server.

``_Embedding`` and ``_Decoder`` are the checks' own remote parts, seeded, counting their
calls (and whether each came inside a distributed autograd context) in the process they
live in; ``_parts`` builds them on ps with an LSTM here, and the same three modules here
for the expected values.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F

from .._compat import torch_compat
from ._checking import _call, _Checks, _close, _loss_is, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

_VOCAB, _WIDTH = 6, 4
_REMOTE = ("call the remote part through its RRef, on its owner: "
           "emb_rref.rpc_sync().forward(tokens) and decoder_rref.rpc_sync().forward(output)")


# torch's random generator is one per process, shared by its RPC threads: two parts built
# on ps at the same time would draw from each other's seeded streams.
_SEEDING = threading.Lock()


def _seeded(seed, make):
    with _SEEDING, torch.random.fork_rng():  # the caller's random stream stays as it was
        torch.manual_seed(seed)
        return make()


def _in_context() -> bool:
    return torch_compat.context_id_or_none() is not None


class _Part(nn.Module):
    """A remote part for the checks: one seeded layer that counts its calls."""

    def __init__(self, make, seed):
        super().__init__()
        self.layer, self.calls = _seeded(seed, make), []

    def forward(self, x):
        self.calls.append(_in_context())
        return self.layer(x)

    def call_log(self):
        return list(self.calls)

    def weights(self):
        return [p.detach().clone() for p in self.parameters()]


def _embedding():
    return _Part(lambda: nn.Embedding(_VOCAB, _WIDTH), 1)


def _decoder():
    return _Part(lambda: nn.Linear(_WIDTH, _VOCAB), 3)


def _lstm():
    return _seeded(2, lambda: nn.LSTM(_WIDTH, _WIDTH))


def _parts():
    """The embedding and the decoder on ps, an LSTM here; and the three again, here."""
    emb, dec = rpc.remote("ps", _embedding), rpc.remote("ps", _decoder)
    return (emb, _lstm(), dec), (_embedding(), _lstm(), _decoder())


def _tokens(seed, rows=3, batch=2):
    return torch.randint(0, _VOCAB, (rows, batch), generator=torch.Generator().manual_seed(seed))


def _zeros(batch=2):
    return torch.zeros(1, batch, _WIDTH), torch.zeros(1, batch, _WIDTH)


@CHECKS.exercise("rnn.rnn_forward")
def _check_rnn_forward(rnn_forward) -> str:
    (emb, lstm, dec), (emb_here, lstm_here, dec_here) = _parts()
    tokens = _tokens(7)
    got = _call(rnn_forward, emb, lstm, dec, tokens, _zeros(),
                what="rnn_forward(emb_rref, rnn, decoder_rref, tokens, hidden)",
                none_hint="return the decoder's output and the new hidden state")
    ran = {name: len(r.rpc_sync().call_log()) for name, r in (("embedding", emb), ("decoder", dec))}
    missing = [name for name, n in ran.items() if n == 0]
    if missing:
        raise _Wrong(f"the {' and the '.join(missing)} never ran on ps: to_here() fetched a copy "
                     "and ran it here, where the optimizer cannot train it", _REMOTE)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise _Wrong(f"rnn_forward returned {_show(got)}; expected a pair (output, hidden)",
                     "return the decoder's output and the hidden state the LSTM returned")
    output, hidden = got
    expected, expected_hidden = lstm_here(emb_here(tokens), _zeros())
    expected = dec_here(expected)
    if not _close(output, expected.detach()):
        raise _Wrong(f"the output is {_show(output)}; decoder(rnn(embedding(tokens))) is "
                     f"{_show(expected)}", "embedding on ps, then the LSTM here with `hidden`, "
                     "then the decoder on ps")
    if not (isinstance(hidden, tuple) and _close(hidden[0], expected_hidden[0].detach())):
        raise _Wrong("the output is right, but the hidden state is not the LSTM's new one",
                     "output, hidden = rnn(emb, hidden); return the decoder's output and that hidden")
    return "the embedding and the decoder ran on ps, the LSTM here; output and state are right"


def _owned_report(rrefs, table_rref) -> dict:
    """Runs on ps: which RRefs ps owns, and whether they hold the embedding's own parameters."""
    mine = [r for r in rrefs if r.owner().name == rpc.get_worker_info().name]
    table = list(table_rref.local_value().parameters())
    return {"ps": len(mine), "same": sum(any(r.local_value() is p for p in table) for r in mine)}


@CHECKS.exercise("rnn.parameter_rrefs")
def _check_parameter_rrefs(parameter_rrefs) -> str:
    (emb, lstm, dec), _ = _parts()
    got = _call(parameter_rrefs, emb, lstm, dec, what="parameter_rrefs(emb_rref, rnn, decoder_rref)",
                none_hint="return the list of parameter RRefs")
    rrefs = "the RRefs of the remote parts' parameters, made on their owner, plus [RRef(p) for p in rnn.parameters()]"
    if not isinstance(got, (list, tuple)) or not all(isinstance(r, rpc.PyRRef) for r in got):
        raise _Wrong(f"parameter_rrefs returned {_show(got)}; expected a list of RRefs", rrefs)
    here = [r for r in got if r.is_owner()]
    report = rpc.rpc_sync("ps", _owned_report, args=(list(got), emb))
    if report["ps"] == 0 and len(here) > len(list(lstm.parameters())):
        raise _Wrong("every RRef is owned by master: the embedding's and the decoder's "
                     "parameters were wrapped here, so they are copies of ps's",
                     "make the RRefs on ps: a function run there with rpc.rpc_sync(rref.owner(), "
                     "...) that returns [RRef(p) for p in rref.local_value().parameters()]")
    if report["ps"] != 3 or report["same"] != 1:
        raise _Wrong(f"ps owns {report['ps']} of the RRefs; expected 3 (the embedding's weight, "
                     "the decoder's weight and bias), holding the parameters themselves", rrefs)
    if len(here) != len(list(lstm.parameters())):
        raise _Wrong(f"master owns {len(here)} of the RRefs; the LSTM here has "
                     f"{len(list(lstm.parameters()))} parameters, which the optimizer must step too",
                     "add [RRef(p) for p in rnn.parameters()]")
    return "3 parameter RRefs owned by ps (embedding, decoder) and 4 by master (the LSTM)"


def _expected_step(parts, tokens, targets, lr):
    emb, lstm, dec = parts
    output, _ = lstm(emb(tokens), _zeros())
    loss = F.cross_entropy(dec(output).view(-1, _VOCAB), targets.reshape(-1))
    loss.backward()
    return loss.item(), [(p - lr * p.grad).detach() for m in parts for p in m.parameters()]


@CHECKS.exercise("rnn.train_step")
def _check_train_step(train_step) -> str:
    from torch.distributed.optim import DistributedOptimizer

    (emb, lstm, dec), here = _parts()
    lr, tokens, targets = 0.5, _tokens(8), _tokens(9)
    params = [rpc.RRef(p) for p in lstm.parameters()]
    params += rpc.rpc_sync("ps", _part_rrefs, args=(emb,)) + rpc.rpc_sync("ps", _part_rrefs, args=(dec,))
    optimizer = DistributedOptimizer(torch.optim.SGD, params, lr=lr)
    expected_loss, expected = _expected_step(here, tokens, targets, lr)
    got = _call(train_step, emb, lstm, dec, optimizer, tokens, targets, _zeros(),
                what="train_step(emb_rref, rnn, decoder_rref, optimizer, tokens, targets, hidden)",
                none_hint="return the loss and the new hidden state")
    if not any(emb.rpc_sync().call_log()):
        raise _Wrong("the forward pass ran outside a dist_autograd context: its RPCs were not "
                     "recorded, so no gradient could reach ps", "run rnn_forward, the loss, "
                     "dist_autograd.backward and optimizer.step inside `with "
                     "dist_autograd.context() as context_id:`")
    now = (emb.rpc_sync().weights() + [p.detach() for p in lstm.parameters()]
           + dec.rpc_sync().weights())
    if not all(_close(n, e) for n, e in zip(now, expected)):
        raise _Wrong("the weights are not those of one SGD step on the chunk's loss",
                     "one context: rnn_forward, F.cross_entropy(output.view(-1, ntoken), "
                     "targets.reshape(-1)), dist_autograd.backward, optimizer.step(context_id)")
    if not (isinstance(got, tuple) and len(got) == 2 and _loss_is(got[0], expected_loss)):
        raise _Wrong(f"the update is right, but train_step returned {_show(got)}; expected "
                     f"(loss, hidden) with the loss {expected_loss:.4f}",
                     "return loss.item(), hidden")
    if any(h.requires_grad for h in got[1]):
        raise _Wrong("the hidden state returned still requires grad: the next step would "
                     "backpropagate into this step's graph, whose context is gone",
                     "return tuple(h.detach() for h in hidden)")
    return "one step moved the embedding and decoder on ps and the LSTM here, exactly"


def _part_rrefs(part_rref):
    """Runs on the owner: RRefs of a part's own parameters."""
    return [rpc.RRef(p) for p in part_rref.local_value().parameters()]
