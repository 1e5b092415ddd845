"""The teaching labs' source notebooks in ``tutorials/labs/source`` and their checker, ``nbrpc.lab``.

The source notebooks are nbgrader's instructor versions: their structure (solution
regions, locked cells, test cells with points and hidden tests) is checked here, their
saved outputs by nbval, and grading by real nbgrader commands in ``test_nbgrader.py``.
The checker's messages for typical mistakes are tested in this process: labs 3 and 7's on
a ps + trainer1 + trainer2 cluster of their own, lab 5's on observer1 + observer2, lab 6's
on client1 + client2 + client3, lab 8's on ps + trainer0 + trainer1 with the trainers' DDP group,
labs 1, 2 and 4's on the shared worker1 + worker2 cluster.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import cloudpickle
import nbformat
import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from conftest import as_main, run, wait_gone
from torch.distributed.optim import DistributedOptimizer

import nbrpc
from nbrpc import lab

pytestmark = pytest.mark.slow

SOURCE = Path(__file__).parent.parent / "tutorials" / "labs" / "source"
NOTEBOOKS = {"rpc_basics": "01_rpc_basics", "dist_autograd": "02_dist_autograd",
             "param_server": "03_param_server", "pipeline": "04_pipeline",
             "rl": "05_rl", "federated": "06_federated", "rnn": "07_rnn", "hybrid": "08_hybrid",
             "hangs": "09_hangs"}

# The wrong answers below are shipped to the workers by value, like notebook code.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def exercises(name: str) -> list[str]:
    return [e for e in lab._CHECKS if e.split(".")[0] == name]


def check_lines(exercise, *answer, capsys) -> str:
    """What a check cell shows: the ✓ line it prints, or the ✗ lines it raises."""
    try:
        lab.check(exercise, *answer)
    except lab.CheckFailed as failed:
        assert failed._render_traceback_() == str(failed).splitlines()
        return f"{failed}\n"
    return capsys.readouterr().out


def assert_feedback(out: str, exercise: str, what: str, hint: str) -> None:
    """``out`` is a check's ✗ line for ``exercise`` saying ``what``, then a hint with ``hint``."""
    first, hint_line = out.rstrip("\n").split("\n")
    assert first.startswith(f"✗ {exercise}: ") and what in first, first
    assert hint_line.startswith("    hint: ") and hint in hint_line, hint_line


@contextmanager
def lab_cluster(*args, **options):
    """A lab's cluster for the tests of one class (``nbrpc.start``'s arguments); every
    process it started is gone after."""
    if nbrpc.current() is not None:
        pytest.skip("another cluster is running in this process")
    cluster = nbrpc.start(*args, **{"progress": None, "timeout": 30, **options})
    pids = [w.pid for w in cluster.workers]
    try:
        yield cluster
    finally:
        cluster.shutdown()
    assert not wait_gone(pids)


# -- the source notebooks as files -----------------------------------------------------


def grading(cell) -> dict:
    return cell.metadata["nbgrader"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_source_notebook_is_an_nbgrader_assignment(name):
    nb = nbformat.read(SOURCE / NOTEBOOKS[name] / f"{NOTEBOOKS[name]}.ipynb", as_version=4)
    assert all(grading(c)["schema_version"] == 3 for c in nb.cells)
    ids = [grading(c)["grade_id"] for c in nb.cells]
    assert len(set(ids)) == len(ids)
    solutions = [c for c in nb.cells if grading(c)["solution"]]
    tests = [c for c in nb.cells if grading(c)["grade"]]
    names = [e.split(".")[1] for e in exercises(name)]
    assert [grading(c)["grade_id"] for c in solutions] == names
    assert [grading(c)["grade_id"] for c in tests] == [f"test_{n}" for n in names]
    for cell in solutions:
        assert cell.cell_type == "code" and not grading(cell)["locked"]
        assert "# TODO" in cell.source and cell.source.count("### BEGIN SOLUTION") == cell.source.count(
            "### END SOLUTION") >= 1
    for cell, exercise in zip(tests, exercises(name)):
        assert grading(cell)["locked"] and grading(cell)["points"] > 0
        assert cell.source.startswith(f'lab.check("{exercise}", ')
        assert "\n### BEGIN HIDDEN TESTS\n" in cell.source and cell.source.endswith("\n### END HIDDEN TESTS")
    others = [c for c in nb.cells if not grading(c)["solution"] and not grading(c)["grade"]]
    assert all(grading(c)["locked"] and "points" not in grading(c) for c in others)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[-2].source == "lab.summary()"
    assert code[-1].source.endswith("%rpc_shutdown")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_source_notebook_is_saved_with_every_check_passing(name):
    # nbval runs it again and compares; the saved outputs are what a teacher reads.
    nb = nbformat.read(SOURCE / NOTEBOOKS[name] / f"{NOTEBOOKS[name]}.ipynb", as_version=4)
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    tests = [c for c in nb.cells if grading(c)["grade"]]
    for cell, exercise in zip(tests, exercises(name)):
        assert "".join(o.get("text", "") for o in cell.outputs).startswith(f"✓ {exercise}: ")
    summary = next(c for c in nb.cells if c.source == "lab.summary()")
    n = len(exercises(name))
    assert "".join(o.text for o in summary.outputs).startswith(f"{name}: {n} of {n} exercises pass")


# -- the checker, in this process ------------------------------------------------------


def test_check_without_a_cluster_says_how_to_start_one(capsys):
    if nbrpc.current() is not None:
        pytest.skip("another test module left a cluster running")
    out = check_lines("rpc_basics.square_on", lambda worker, x: None, capsys=capsys)
    assert out == ("✗ rpc_basics.square_on: no cluster is running\n    hint: run the %rpc_init "
                   "cell at the top of this lab (after %rpc_shutdown, run it again), then the "
                   "cells from there on\n")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x, params=None):
        w1, b1, w2, b2 = self.parameters() if params is None else params
        return F.linear(F.relu(F.linear(x, w1, b1)), w2, b2)


class ParameterServer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = Net()

    def forward(self, x):
        return self.model(x, [p.clone() for p in self.model.parameters()])

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.model.parameters()]


def train_step(ps_rref, optimizer, x, y):
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y)
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)
    return loss.item()


class Trainer:
    def __init__(self, ps_rref, x, y, lr=0.02):
        self.ps, self.x, self.y, self.spans = ps_rref, x, y, []
        self.optimizer = DistributedOptimizer(
            torch.optim.Adam, ps_rref.rpc_sync().parameter_rrefs(), lr=lr)

    def train_epoch(self, batch_size=64):
        began = time.time()
        losses = [train_step(self.ps, self.optimizer, self.x[b], self.y[b])
                  for b in torch.randperm(len(self.x)).split(batch_size)]
        self.spans.append((began, time.time()))
        return losses


def rrefs_to_copies(module):
    return [rpc.RRef(p.detach()) for p in module.parameters()]


def the_parameters(module):
    return list(module.parameters())


def step_without_update(ps_rref, optimizer, x, y):
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y)
        dist_autograd.backward(context_id, [loss])
    return loss.item()


def step_without_context(ps_rref, optimizer, x, y):
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y)
        dist_autograd.backward(context_id, [loss])
        optimizer.step()
    return loss.item()


def one_trainer_at_a_time(trainers, epochs):
    return [[t.rpc_sync().train_epoch() for t in trainers] for _ in range(epochs)]


def busiest_by_sum(snapshot):
    """Adds up call durations: a worker running three calls at once counts three times."""
    total = {}
    for call in snapshot["calls"]:
        if call["began"] is not None:
            total[call["callee"]] = total.get(call["callee"], 0.0) + call["ended"] - call["began"]
    worker = max(total, key=total.get)
    return worker, total[worker] / (snapshot["end"] - snapshot["start"])


def busiest_with_missing_parts(snapshot):
    total = {}
    for call in snapshot["calls"]:
        total[call["callee"]] = total.get(call["callee"], 0.0) + call["ended"] - call["began"]
    return max(total, key=total.get), 0.0


@pytest.fixture(scope="class")
def ps_cluster():
    """Lab 3's cluster, ps + trainer1 + trainer2, for the tests of one class."""
    with lab_cluster(names=["ps", "trainer1", "trainer2"]) as cluster:
        yield cluster


@pytest.mark.usefixtures("ps_cluster")
class TestParameterServerMistakes:
    @pytest.mark.parametrize("answer, what, hint", [
        (rrefs_to_copies, "the RRefs hold copies of the parameters, not the parameters "
         "themselves", "RRef(p), not RRef(p.detach())"),
        (the_parameters, "parameter_rrefs returned Parameter items, not RRefs",
         "[RRef(p) for p in module.parameters()]"),
    ], ids=["copies", "tensors"])
    def test_parameter_rrefs(self, capsys, answer, what, hint):
        out = check_lines("param_server.parameter_rrefs", answer, capsys=capsys)
        assert out.startswith(f"✗ param_server.parameter_rrefs: {what}") and hint in out, out

    @pytest.mark.parametrize("answer, what, hint", [
        (step_without_update, "the server's weights did not change",
         "call optimizer.step(context_id) inside the context"),
        (step_without_context, "raised TypeError: DistributedOptimizer.step() missing 1 "
         "required positional argument: 'context_id'", "optimizer.step(context_id)"),
    ], ids=["no-step", "no-context-id"])
    def test_train_step(self, capsys, answer, what, hint):
        out = check_lines("param_server.train_step", answer, capsys=capsys)
        assert out.startswith("✗ param_server.train_step: ") and what in out and hint in out, out

    def test_trainers_that_take_turns(self, capsys):
        x, y, _, _ = lab.digits()
        ps = rpc.remote("ps", ParameterServer)
        trainers = [rpc.remote(name, Trainer, args=(ps, x[i::2], y[i::2]))
                    for i, name in enumerate(["trainer1", "trainer2"])]
        out = check_lines("param_server.run_training", one_trainer_at_a_time, ps, trainers,
                          capsys=capsys)
        assert out == ("✗ param_server.run_training: the trainers took turns: no two epochs ran "
                       "at the same time\n    hint: in each epoch, start train_epoch on every "
                       "trainer with rpc_async (trainer.rpc_async().train_epoch()), then wait for "
                       "all the futures\n")
        del ps, trainers

    @pytest.mark.parametrize("answer, what, hint", [
        (busiest_by_sum, "counting its overlapping calls twice", "overlapping calls count once"),
        (busiest_with_missing_parts, "raised TypeError: unsupported operand type(s)",
         "callee's part was not recorded"),
    ], ids=["overlaps-counted-twice", "missing-callee-part"])
    def test_busiest(self, capsys, answer, what, hint):
        out = check_lines("param_server.busiest", answer, capsys=capsys)
        assert out.startswith("✗ param_server.busiest: ") and what in out and hint in out, out


# Lab 7's typical mistakes, around a right rnn_forward that the wrong steps call.
def rnn_forward(emb_rref, rnn, decoder_rref, tokens, hidden):
    output, hidden = rnn(emb_rref.rpc_sync().forward(tokens), hidden)
    return decoder_rref.rpc_sync().forward(output), hidden


def rnn_forward_on_copies(emb_rref, rnn, decoder_rref, tokens, hidden):
    output, hidden = rnn(emb_rref.to_here()(tokens), hidden)
    return decoder_rref.to_here()(output), hidden


def rrefs_made_here(emb_rref, rnn, decoder_rref):
    return [rpc.RRef(p) for m in (emb_rref.to_here(), rnn, decoder_rref.to_here())
            for p in m.parameters()]


def _owned_rrefs(module_rref):
    return [rpc.RRef(p) for p in module_rref.local_value().parameters()]


def rrefs_without_the_lstm(emb_rref, rnn, decoder_rref):
    return [r for m in (emb_rref, decoder_rref) for r in rpc.rpc_sync(m.owner(), _owned_rrefs, args=(m,))]


def rnn_step_keeping_the_graph(emb_rref, rnn, decoder_rref, optimizer, tokens, targets, hidden):
    with dist_autograd.context() as context_id:
        output, hidden = rnn_forward(emb_rref, rnn, decoder_rref, tokens, hidden)
        loss = F.cross_entropy(output.view(-1, output.shape[-1]), targets.reshape(-1))
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)
    return loss.item(), hidden


def rnn_step_without_context(emb_rref, rnn, decoder_rref, optimizer, tokens, targets, hidden):
    output, hidden = rnn_forward(emb_rref, rnn, decoder_rref, tokens, hidden)
    loss = F.cross_entropy(output.view(-1, output.shape[-1]), targets.reshape(-1))
    loss.backward()
    return loss.item(), tuple(h.detach() for h in hidden)


@pytest.mark.usefixtures("ps_cluster")
class TestDistributedRnnMistakes:
    @pytest.mark.parametrize("exercise, answer, what, hint", [
        ("rnn.rnn_forward", rnn_forward_on_copies, "the embedding and the decoder never ran on ps",
         "emb_rref.rpc_sync().forward(tokens)"),
        ("rnn.parameter_rrefs", rrefs_made_here, "every RRef is owned by master",
         "make the RRefs on ps"),
        ("rnn.parameter_rrefs", rrefs_without_the_lstm, "master owns 0 of the RRefs",
         "add [RRef(p) for p in rnn.parameters()]"),
        ("rnn.train_step", rnn_step_keeping_the_graph, "the hidden state returned still requires grad",
         "return tuple(h.detach() for h in hidden)"),
        ("rnn.train_step", rnn_step_without_context, "ran outside a dist_autograd context",
         "inside `with dist_autograd.context() as context_id:`"),
    ], ids=["to-here-copies", "rrefs-to-copies", "lstm-left-out", "hidden-not-detached",
            "no-context"])
    def test_typical_mistakes(self, capsys, exercise, answer, what, hint):
        assert_feedback(check_lines(exercise, answer, capsys=capsys), exercise, what, hint)


def returns_backwards(rewards, gamma):
    returns, g = [], 0.0
    for r in reversed(rewards):
        g = r + gamma * g
        returns.append(g)
    return returns


def returns_of_the_past(rewards, gamma):
    returns, g, discount = [], 0.0, 1.0
    for r in rewards:
        g, discount = g + discount * r, discount * gamma
        returns.append(g)
    return returns


@rpc.functions.async_execution
def act_alone(agent_rref, observer_id, state):
    action = torch.futures.Future()
    action.set_result(agent_rref.local_value().act(torch.as_tensor(state, dtype=torch.float32)[None])[0].item())
    return action


@rpc.functions.async_execution
def keep_the_old_future(agent_rref, observer_id, state):
    agent = agent_rref.local_value()
    agent.states[observer_id] = torch.as_tensor(state, dtype=torch.float32)
    mine = agent.future.then(lambda f: f.value()[observer_id].item())
    with agent.lock:
        agent.pending -= 1
        if agent.pending == 0:
            agent.pending = len(agent.states)
            agent.future.set_result(agent.act(agent.states))
    return mine


def select_action_undecorated(agent_rref, observer_id, state):
    return torch.futures.Future()


def play_one_by_one(agent_rref, observers, steps):
    return [o.rpc_sync().run_episode(agent_rref, steps) for o in observers]


@pytest.fixture(scope="class")
def observer_cluster():
    """Lab 5's cluster, observer1 + observer2, for the tests of one class."""
    with lab_cluster(names=["observer1", "observer2"]) as cluster:
        yield cluster


@pytest.mark.usefixtures("observer_cluster")
class TestReinforcementLearningMistakes:
    @pytest.mark.parametrize("exercise, answer, what, hint", [
        ("rl.discounted_returns", returns_backwards, "the returns are in reverse order",
         "reverse the list at the end"),
        ("rl.discounted_returns", returns_of_the_past, "summed the rewards before it",
         "walk the rewards from the last"),
        ("rl.select_action", act_alone, "once per observer, not once per batch",
         "call agent.act only when the last observer of the step has arrived"),
        ("rl.select_action", keep_the_old_future, "got no action in step 2, after step 1 had "
         "worked", "put a new torch.futures.Future() in agent.future"),
        ("rl.select_action", select_action_undecorated,
         "not decorated with @rpc.functions.async_execution", "put @rpc.functions.async_execution"),
        ("rl.play_round", play_one_by_one, "got no answer within 3 s",
         "a batch waits for every observer"),
    ], ids=["reversed", "past-rewards", "one-run-per-observer", "old-future", "undecorated",
            "one-by-one"])
    def test_typical_mistakes(self, capsys, exercise, answer, what, hint):
        assert_feedback(check_lines(exercise, answer, capsys=capsys), exercise, what, hint)


def average_without_weights(states, counts):
    return {key: sum(s[key] for s in states) / len(states) for key in states[0]}


def average_without_the_total(states, counts):
    return {key: sum(s[key] * n for s, n in zip(states, counts)) for key in states[0]}


def weighted_average(states, counts):
    total = sum(counts)
    return {key: sum(s[key] * (n / total) for s, n in zip(states, counts)) for key in states[0]}


def round_one_client_at_a_time(model, clients, round_no):
    weights = model.state_dict()
    states, counts = zip(*[c.rpc_sync().train(weights, round_no) for c in clients])
    model.load_state_dict(weighted_average(states, counts))


def round_without_loading(model, clients, round_no):
    futures = [c.rpc_async().train(model.state_dict(), round_no) for c in clients]
    states, counts = zip(*[f.wait() for f in futures])
    return weighted_average(states, counts)


def round_waiting_for_the_straggler(model, clients, round_no, deadline):
    futures = [c.rpc_async().train(model.state_dict(), round_no) for c in clients]
    states, counts = zip(*[f.wait() for f in futures])
    model.load_state_dict(weighted_average(states, counts))
    return len(counts)


def round_failing_at_the_deadline(model, clients, round_no, deadline):
    futures = [c.rpc_async(timeout=deadline).train(model.state_dict(), round_no) for c in clients]
    states, counts = zip(*[f.wait() for f in futures])
    model.load_state_dict(weighted_average(states, counts))
    return len(counts)


@pytest.fixture(scope="class")
def client_cluster():
    """Lab 6's cluster, client1 + client2 + client3, for the tests of one class."""
    with lab_cluster(names=["client1", "client2", "client3"]) as cluster:
        yield cluster


@pytest.mark.usefixtures("client_cluster")
class TestFederatedMistakes:
    @pytest.mark.parametrize("exercise, answer, what, hint", [
        ("federated.weighted_average", average_without_weights,
         "gave every client the same weight", "n / sum(counts)"),
        ("federated.weighted_average", average_without_the_total,
         "did not divide by their total", "n / sum(counts)"),
        ("federated.fedavg_round", round_one_client_at_a_time,
         "the clients trained one after the other", "start every client's train with rpc_async"),
        ("federated.fedavg_round", round_without_loading,
         "the server's model did not change", "model.load_state_dict(average)"),
        ("federated.round_with_deadline", round_waiting_for_the_straggler,
         "it waited for client3", "client.rpc_async(timeout=deadline)"),
        ("federated.round_with_deadline", round_failing_at_the_deadline,
         "raised RpcTimeoutError: rpc_async('client3', _Client.train) got no answer within 1 s",
         "catch the error of that future"),
    ], ids=["unweighted", "not-normalised", "one-by-one", "not-loaded", "waits-for-straggler",
            "timeout-raised"])
    def test_typical_mistakes(self, capsys, exercise, answer, what, hint):
        assert_feedback(check_lines(exercise, answer, capsys=capsys), exercise, what, hint)


# Lab 8's typical mistakes, around a right forward pass and parameter list.
def hybrid_forward(emb_rref, fc, indices, offsets):
    return fc(emb_rref.rpc_sync().forward(indices, offsets))


def hybrid_forward_on_a_copy(emb_rref, fc, indices, offsets):
    return fc(emb_rref.to_here()(indices, offsets))


def hybrid_rrefs(emb_rref, fc):
    return emb_rref.rpc_sync().parameter_rrefs() + [rpc.RRef(p) for p in fc.parameters()]


def table_rrefs_only(emb_rref, fc):
    return emb_rref.rpc_sync().parameter_rrefs()


def hybrid_train(rrefs, backward, wrap=True, context=True):
    """A trainer's loop, right but for the parts given."""
    def train(emb_rref, dense, batches, lr):
        from torch.nn.parallel import DistributedDataParallel

        fc = DistributedDataParallel(dense) if wrap else dense
        optimizer = DistributedOptimizer(torch.optim.SGD, rrefs(emb_rref, fc), lr=lr)
        losses = []
        for indices, offsets, target in batches:
            with dist_autograd.context() if context else nullcontext(None) as context_id:
                loss = F.cross_entropy(hybrid_forward(emb_rref, fc, indices, offsets), target)
                backward(context_id, loss)
                if context:
                    optimizer.step(context_id)
            losses.append(loss.item())
        return losses
    return train


def distributed_backward(context_id, loss):
    dist_autograd.backward(context_id, [loss])


def local_backward(context_id, loss):
    loss.backward()


def init_group(rank, port):
    import datetime

    import torch.distributed as dist
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=20))


@pytest.fixture(scope="class")
def hybrid_cluster():
    """Lab 8's cluster, ps + trainer0 + trainer1, the trainers in a gloo group of their own."""
    with lab_cluster(names=["ps", "trainer0", "trainer1"]) as cluster:
        port = lab.ddp_port()
        for future in [rpc.rpc_async(f"trainer{rank}", init_group, args=(rank, port)) for rank in (0, 1)]:
            future.wait()
        yield cluster


@pytest.mark.usefixtures("hybrid_cluster")
class TestHybridMistakes:
    @pytest.mark.parametrize("exercise, answer, what, hint", [
        ("hybrid.hybrid_forward", hybrid_forward_on_a_copy, "the embedding table never ran on ps",
         "emb_rref.rpc_sync().forward(indices, offsets)"),
        ("hybrid.parameter_rrefs", table_rrefs_only, "the RRefs cover the embedding table only",
         "add [RRef(p) for p in fc.parameters()]"),
        ("hybrid.train", hybrid_train(hybrid_rrefs, distributed_backward, wrap=False),
         "the trainers' dense layers differ", "wrap the dense layer in DDP, fc = DDP(dense)"),
        ("hybrid.train", hybrid_train(table_rrefs_only, distributed_backward),
         "the dense layer did not change on either trainer", "the dense layer's RRefs too"),
        ("hybrid.train", hybrid_train(hybrid_rrefs, local_backward),
         "loss.backward()", "dist_autograd.backward(context_id, [loss])"),
        ("hybrid.train", hybrid_train(hybrid_rrefs, local_backward, context=False),
         "ran outside a dist_autograd context", "inside `with dist_autograd.context() as context_id:`"),
    ], ids=["to-here-copy", "dense-left-out", "no-ddp", "optimizer-without-dense", "local-backward",
            "no-context"])
    def test_typical_mistakes(self, capsys, exercise, answer, what, hint):
        assert_feedback(check_lines(exercise, answer, capsys=capsys), exercise, what, hint)

    def test_an_unfinished_train_is_not_done_and_prints_no_traceback(self, capsys):
        def train(emb_rref, dense, batches, lr):
            raise NotImplementedError()

        out = check_lines("hybrid.train", train, capsys=capsys)
        assert out.startswith("✗ hybrid.train: not done yet: train still raises NotImplementedError\n"), out
        assert "Traceback" not in capsys.readouterr().err

    def test_trainers_without_a_group_are_told_which_cell_forms_it(self, capsys):
        import torch.distributed as dist

        for future in [rpc.rpc_async(f"trainer{rank}", dist.destroy_process_group) for rank in (0, 1)]:
            future.wait()
        try:
            out = check_lines("hybrid.train", hybrid_train(hybrid_rrefs, distributed_backward), capsys=capsys)
        finally:
            port = lab.ddp_port()
            for future in [rpc.rpc_async(f"trainer{rank}", init_group, args=(rank, port)) for rank in (0, 1)]:
                future.wait()
        assert out.startswith("✗ hybrid.train: trainer0 has no process group for DDP yet\n    hint: run the "
                              "%%rpc_on trainer0,trainer1 cell that calls dist.init_process_group"), out

    def test_the_solution_passes(self, capsys):
        out = check_lines("hybrid.train", hybrid_train(hybrid_rrefs, distributed_backward), capsys=capsys)
        assert out.startswith("✓ hybrid.train: "), out
# Lab 9's wrong answers, run as the student's cells are: functions of __main__ that share
# its locks, events and lists on each worker. Each mistake has locks of its own, so that a
# call one leaves stuck cannot block the next.
HANG_CELLS = """
import threading
import torch
import torch.distributed.rpc as rpc

lock1, lock2 = threading.Lock(), threading.Lock()
def inner1(y):
    with lock1:
        return y + 1
def inner2(y):
    with lock2:
        return y + 1
def outer_still_locked(x):
    with lock1:
        y = 2 * x
        return rpc.rpc_sync("worker1", inner1, args=(y,), timeout=4)
def outer_with_a_longer_timeout(x):
    with lock2:
        y = 2 * x
        return rpc.rpc_sync("worker1", inner2, args=(y,), timeout=9)

event, event2, version, waiters = threading.Event(), threading.Event(), {"now": 0}, []
def wait_blocking():
    event.wait(4)
    return version["now"]
@rpc.functions.async_execution
def wait_in_the_async_function():
    event2.wait(4)
    future = torch.futures.Future()
    future.set_result(version["now"])
    return future
def push_to_blocking(v):
    version["now"] = v
    event.set()
    return v
def wait_undecorated():
    future = torch.futures.Future()
    waiters.append(future)
    return future
def wait_for_nothing():
    return version["now"]
def push_to_event2(v):
    version["now"] = v
    event2.set()
    return v
def push_to_undecorated(v):
    while waiters:
        waiters.pop().set_result(v)
    return v

held, settings = threading.Lock(), {"scale": 3.0}
def read_scale():
    with held:
        return settings["scale"]
def scaled(x):
    return x * rpc.rpc_sync("master", read_scale, timeout=6)
def rescale_still_held(x, scale):
    with held:
        settings["scale"] = scale
        return rpc.remote("worker2", scaled, args=(x,)).to_here(timeout=3)
def rescale_returning_the_rref(x, scale):
    with held:
        settings["scale"] = scale
    return rpc.remote("worker2", torch.mul, args=(x, scale))
from nbrpc import lab
DISCOUNTS = {"eu": 0.2, "us": 0.1}
def region_stripped():
    return "eu"
def region_guessed():
    return "us"
def total_unfixed(prices):
    rate = DISCOUNTS.get(lab.region_here(), 0.0)
    return round(sum(prices) * (1 - rate), 2)
def total_unrounded(prices):
    rate = DISCOUNTS.get(lab.region_here().strip(), 0.0)
    return sum(prices) * (1 - rate) + 0.001
"""


@pytest.fixture(scope="class")
def hangs_shell(ip):
    """Lab 9's cluster (worker1, worker2, 4 RPC threads each), HANG_CELLS run in the shell."""
    with lab_cluster(2, threads=4, timeout=5), as_main(ip):
        run(ip, HANG_CELLS)
        yield ip


HANG_MISTAKES = [
    ("hangs.lock_kind", "cycle", "lock_kind() says 'cycle', but the graph is master -> worker1 "
     "(outer) -> worker1 (inner), and inner is blocked at `with lock:`", "print the findings"),
    ("hangs.pool_kind", "blocked", "pool_kind() says 'blocked', but every RPC thread of worker1 "
     "runs wait_for_update", "print the findings"),
    ("hangs.caller_kind", "deadlock", "'deadlock' is not a kind nbrpc names", "return the kind"),
    ("hangs.outer_fixed", "outer_still_locked", "outer_fixed still hangs (nbrpc: blocked): the lock "
     "is still held while it calls inner on worker1", "release the lock before the nested call"),
    ("hangs.outer_fixed", "outer_with_a_longer_timeout", "which needs that lock (a longer timeout "
     "only makes the hang longer)", "release the lock before the nested call"),
    ("hangs.wait_for_update_fixed", "wait_blocking push_to_blocking", "wait_for_update_fixed still "
     "hangs (nbrpc: pool_exhausted): each call holds one of worker1's 4 RPC threads while it "
     "waits", "do not wait in wait_for_update_fixed"),
    ("hangs.wait_for_update_fixed", "wait_in_the_async_function push_to_event2",
     "wait_for_update_fixed still hangs: calls to it got no answer within 4 s",
     "do not wait in wait_for_update_fixed"),
    ("hangs.wait_for_update_fixed", "wait_for_nothing push_to_event2",
     "before any update was pushed: it must wait for the next push_update_fixed",
     "return a new torch.futures.Future() kept in waiters"),
    ("hangs.wait_for_update_fixed", "wait_undecorated push_to_undecorated", "wait_for_update_fixed() "
     "on worker1 raised", "put @rpc.functions.async_execution back"),
    ("hangs.rescale_fixed", "rescale_still_held", "rescale_fixed still hangs (nbrpc: waits_on_caller): "
     "master waits on worker2 while it holds `held`", "pass the value"),
    ("hangs.rescale_fixed", "rescale_returning_the_rref", "rescale_fixed returned an RRef",
     "return rref.to_here()"),
    ("hangs.worker2_region", "region_stripped", "worker2_region() says 'eu': close, but not exactly "
     "what worker2 read", "spaces and all"),
    ("hangs.worker2_region", "region_guessed", "worker2_region() says 'us', which is not the region "
     "worker2 read", "(Pdb) [worker2] prompt type `p region`"),
    ("hangs.discounted_total_fixed", "total_unfixed", "discounted_total_fixed([50.0, 50.0]) on worker2 "
     "is 100.0, not 80.0", "clean the region before the lookup"),
    ("hangs.discounted_total_fixed", "total_unrounded", "discounted_total_fixed([50.0, 50.0]) on worker1 "
     "is 80.001, not 80.0", "rounded to cents"),
]


@pytest.mark.usefixtures("hangs_shell")
class TestHangsMistakes:
    @pytest.mark.parametrize("exercise, answer, what, hint", HANG_MISTAKES,
                             ids=[f"{m[0].split('.')[1]}-{m[1].split()[0]}" for m in HANG_MISTAKES])
    def test_typical_mistakes(self, hangs_shell, capsys, exercise, answer, what, hint):
        if exercise.endswith("_kind"):
            args = (lambda: answer, {"findings": []})
        else:
            args = tuple(hangs_shell.user_ns[name] for name in answer.split())
        began = time.monotonic()
        assert_feedback(check_lines(exercise, *args, capsys=capsys), exercise, what, hint)
        assert time.monotonic() - began < 15, "a check of a hang must give up quickly"
        # The cluster is usable again: nothing pending, worker1 back to nbrpc's serving.
        assert not nbrpc.waits()["calls"] or exercise == "hangs.outer_fixed"
        assert rpc.rpc_sync("worker1", torch.add, args=(1, 1), timeout=5) == 2


def test_unknown_exercise_lists_the_exercises(cluster, capsys):
    out = check_lines("rpc_basics.square", lambda: 1, capsys=capsys)
    assert out.startswith("✗ rpc_basics.square: there is no exercise named 'rpc_basics.square'\n"
                          "    hint: keep the check cell as it was handed out; the exercises are: "
                          "rpc_basics.square_on, rpc_basics.ask_all,")


def test_unfinished_answers_are_not_done(cluster, capsys):
    def square_on(worker, x):
        raise NotImplementedError("square_on")

    def returns_nothing(worker, x):
        rpc.rpc_sync(worker, square_here, args=(x,))

    expected = {square_on: "square_on still raises NotImplementedError",
                returns_nothing: "square_on returned None",
                None: "there is nothing to check yet",
                42: "square_on is 42, not a function yet"}
    for answer, what in expected.items():
        out = check_lines("rpc_basics.square_on", answer, capsys=capsys)
        assert out == (f"✗ rpc_basics.square_on: not done yet: {what}\n    hint: fill in the "
                       "TODO cell above, run it, then run this check again\n")
        assert lab.results()["rpc_basics.square_on"].status == "not done"


def double_there(rref):
    raise NotImplementedError("double_there")


def double_on_owner(rref):
    rpc.rpc_sync(rref.owner(), double_there, args=(rref,))


def double_there_stub(rref):
    # YOUR CODE HERE
    raise NotImplementedError()


def double_on_owner_stub(rref):
    rpc.rpc_sync(rref.owner(), double_there_stub, args=(rref,))


def test_nbgraders_stub_is_not_done(cluster, capsys):
    def square_on(worker, x):
        # YOUR CODE HERE
        raise NotImplementedError()

    out = check_lines("rpc_basics.square_on", square_on, capsys=capsys)
    assert out.startswith("✗ rpc_basics.square_on: not done yet: square_on still raises NotImplementedError\n")


def test_an_unfinished_helper_on_a_worker_is_named_by_nbgraders_stub_too(cluster, capsys):
    out = check_lines("rpc_basics.double_on_owner", double_on_owner_stub, capsys=capsys)
    assert out.startswith("✗ rpc_basics.double_on_owner: not done yet: double_on_owner(rref) reached "
                          "double_there_stub, which still raises NotImplementedError\n    hint: fill in "
                          "double_there_stub ")


def test_an_unfinished_helper_on_a_worker_is_named(cluster, capsys):
    out = check_lines("rpc_basics.double_on_owner", double_on_owner, capsys=capsys)
    assert out == ("✗ rpc_basics.double_on_owner: not done yet: double_on_owner(rref) reached "
                   "double_there, which still raises NotImplementedError\n    hint: fill in "
                   "double_there (in this TODO cell or an earlier one), run its cell and the "
                   "cells after it, then this check\n")


def test_a_checker_that_cannot_finish_reports_instead_of_raising(cluster, capsys):
    out = check_lines("rpc_basics.square_on", square_here, "an extra argument", capsys=capsys)
    assert out.startswith("✗ rpc_basics.square_on: the check could not finish: TypeError: ")


def square_here(x):
    return x ** 2, rpc.get_worker_info().name


def slow_hello(seconds):
    began = time.time()
    time.sleep(seconds)
    return rpc.get_worker_info().name, began, time.time()


class Counter(lab._Counter):
    pass


# Typical mistakes: (exercise, answer, what the check must say, what its hint must say).
def square_locally(worker, x):
    return square_here(x)


def ask_one_by_one(workers, seconds):
    return [rpc.rpc_async(w, slow_hello, args=(seconds,)).wait() for w in workers]


def counter_here(worker, start):
    return Counter(start)


def add_to_copy(counter_rref, n):
    return counter_rref.to_here().add(n)


def double_here(rref):
    rref.local_value().mul_(2)


def double_a_copy(rref):
    return rpc.rpc_sync(rref.owner(), torch.mul, args=(rref.to_here(), 2))


def local_backward(worker, fn, x):
    with dist_autograd.context():
        rpc.rpc_sync(worker, fn, args=(x,)).sum().backward()
        return x.grad


def compute_here(worker, fn, x):
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [fn(x).sum()])
        return dist_autograd.get_gradients(context_id)[x]


def gradients_after_the_context(model_rref, x):
    with dist_autograd.context() as context_id:
        dist_autograd.backward(context_id, [model_rref.rpc_sync().forward(x).sum()])
    return rpc.rpc_sync(model_rref.owner(), owner_grad, args=(context_id, model_rref))


def owner_grad(context_id, model_rref):
    return dist_autograd.get_gradients(context_id)[model_rref.local_value().w]


def step_a_local_copy(model_rref, x, target, lr):
    model = model_rref.to_here()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    loss = F.mse_loss(model(x), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def train_scale_only(scale, shift, x, y, steps, lr):
    from torch.distributed.optim import DistributedOptimizer

    optimizer = DistributedOptimizer(torch.optim.SGD, scale.rpc_sync().parameter_rrefs(), lr=lr)
    losses = []
    for _ in range(steps):
        with dist_autograd.context() as context_id:
            loss = F.mse_loss(shift.rpc_sync().forward(scale.rpc_sync().forward(x)), y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(loss.item())
    return losses


# Lab 4's typical mistakes, around a right pipeline_forward that the wrong steps call.
def pipeline_forward(shard1, shard2, x, micro_batches):
    futures = [shard2.rpc_async().forward(shard1.remote().forward(rpc.RRef(chunk)))
               for chunk in x.tensor_split(micro_batches)]
    return torch.cat(torch.futures.wait_all(futures))


def pipeline_waiting_in_the_loop(shard1, shard2, x, micro_batches):
    return torch.cat([shard2.rpc_async().forward(shard1.remote().forward(rpc.RRef(chunk))).wait()
                      for chunk in x.tensor_split(micro_batches)])


def pipeline_through_master(shard1, shard2, x, micro_batches):
    futures = [shard2.rpc_async().forward(shard1.remote().forward(rpc.RRef(chunk)).to_here())
               for chunk in x.tensor_split(micro_batches)]
    return torch.cat(torch.futures.wait_all(futures))


def pipeline_without_cat(shard1, shard2, x, micro_batches):
    return torch.futures.wait_all([shard2.rpc_async().forward(shard1.remote().forward(rpc.RRef(c)))
                                   for c in x.tensor_split(micro_batches)])


def optimizer_of_shard1(shard1, shard2, lr):
    return DistributedOptimizer(torch.optim.SGD, shard1.rpc_sync().parameter_rrefs(), lr=lr)


def pipeline_step_without_context(shard1, shard2, optimizer, x, y, micro_batches):
    loss = F.cross_entropy(pipeline_forward(shard1, shard2, x, micro_batches), y)
    loss.backward()
    return loss.item()


def pipeline_step_with_local_backward(shard1, shard2, optimizer, x, y, micro_batches):
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(pipeline_forward(shard1, shard2, x, micro_batches), y)
        loss.backward()
        optimizer.step(context_id)
    return loss.item()


def pipeline_step_without_context_id(shard1, shard2, optimizer, x, y, micro_batches):
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(pipeline_forward(shard1, shard2, x, micro_batches), y)
        dist_autograd.backward(context_id, [loss])
        optimizer.step()
    return loss.item()


MISTAKES = [
    ("rpc_basics.square_on", square_locally,
     "square_here ran on master, not on worker2", "rpc.rpc_sync(worker, square_here, args=(x,))"),
    ("rpc_basics.ask_all", ask_one_by_one,
     "the calls ran one after the other", "start every call first, keep the futures"),
    ("rpc_basics.make_counter", counter_here,
     "make_counter returned a Counter object here, on master", "rpc.remote(worker, Counter"),
    ("rpc_basics.add_remote", add_to_copy,
     "the Counter on worker1 still counts 10 after two add_remote(counter, 5) calls (they "
     "returned 15 and 15)", "to_here() is a copy"),
    ("rpc_basics.double_on_owner", double_here,
     "double_on_owner(rref) raised RuntimeError: can't call localValue() on user "
     "WorkerInfo(id=0, name=master)", "local_value() works only on "
     "the RRef's owner"),
    ("rpc_basics.double_on_owner", double_a_copy,
     "the tensor on worker2 did not change: it still holds [1.0, 2.0, 3.0, 4.0]",
     "rref.local_value().mul_(2)"),
    ("dist_autograd.grad_through_rpc", local_backward,
     "grad_through_rpc('worker1', cube, x) raised RuntimeError: graphTask_ INTERNAL ASSERT",
     "use dist_autograd.backward(context_id, [loss])"),
    ("dist_autograd.grad_through_rpc", compute_here,
     "cube never ran on worker1", "rpc.rpc_sync(worker, fn, args=(x,))"),
    ("dist_autograd.grad_of_w", gradients_after_the_context,
     "Could not find autograd context with id", "had already ended"),
    ("dist_autograd.sgd_step", step_a_local_copy,
     "w on worker1 did not change: it is still [1, 2, 3]", "parameter_rrefs()"),
    ("dist_autograd.train_split", train_scale_only,
     "b on worker2 (still 0) never moved", "scale.rpc_sync().parameter_rrefs() + "
     "shift.rpc_sync().parameter_rrefs()"),
    ("pipeline.pipeline_forward", pipeline_waiting_in_the_loop,
     "the micro-batches went one at a time", "wait for them all after the loop, not in it"),
    ("pipeline.pipeline_forward", pipeline_through_master,
     "shard2 got the hidden features as a tensor sent from master",
     "pass shard1's RRef itself to shard2.rpc_async().forward(hidden_rref)"),
    ("pipeline.pipeline_forward", pipeline_without_cat,
     "pipeline_forward returned a list of 4 items; expected one tensor of logits",
     "torch.cat(torch.futures.wait_all(futures))"),
    ("pipeline.make_optimizer", optimizer_of_shard1,
     "the parameters of shard2 on worker2 never moved in a step",
     "the parameter RRefs of both shards"),
    ("pipeline.train_step", pipeline_step_without_context,
     "the forward pass ran outside a dist_autograd context",
     "inside `with dist_autograd.context() as context_id:`"),
    ("pipeline.train_step", pipeline_step_with_local_backward,
     "graphTask_ INTERNAL ASSERT", "use dist_autograd.backward(context_id, [loss])"),
    ("pipeline.train_step", pipeline_step_without_context_id,
     "missing 1 required positional argument: 'context_id'", "optimizer.step(context_id)"),
]


@pytest.mark.parametrize("exercise, answer, what, hint", MISTAKES,
                         ids=[f"{m[0]}-{m[1].__name__}" for m in MISTAKES])
def test_typical_mistakes_get_specific_feedback(cluster, capsys, exercise, answer, what, hint):
    out = check_lines(exercise, answer, capsys=capsys)
    assert "not done" not in out.split("\n")[0]
    assert_feedback(out, exercise, what, hint)
    assert lab.results()[exercise].status == "wrong"


def test_summary_lists_every_exercise_with_its_state(cluster, capsys):
    lab._results.clear()

    def square_on(worker, x):
        return rpc.rpc_sync(worker, square_here, args=(x,))

    check_lines("rpc_basics.square_on", square_on, capsys=capsys)
    check_lines("rpc_basics.ask_all", ask_one_by_one, capsys=capsys)
    check_lines("rpc_basics.make_counter", None, capsys=capsys)
    capsys.readouterr()
    lab.summary()
    assert capsys.readouterr().out == (
        "rpc_basics: 1 of 5 exercises pass\n"
        "  ✓ rpc_basics.square_on: pass\n"
        "  ✗ rpc_basics.ask_all: not right yet (see its check above)\n"
        "  ✗ rpc_basics.make_counter: not done yet\n"
        "  ✗ rpc_basics.add_remote: not checked yet (run its check cell)\n"
        "  ✗ rpc_basics.double_on_owner: not checked yet (run its check cell)\n"
    )
