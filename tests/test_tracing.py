"""Call recording: joining halves (pure), the ring, Chrome traces, and a real cluster's calls."""

from __future__ import annotations

import functools
import gc
import json
import os
import sys
import threading
import time
import weakref

import cloudpickle
import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from conftest import optimizer_steps_sent
from torch.distributed.optim import DistributedOptimizer

import nbrpc
from nbrpc.calls.fanout import ask_members
from nbrpc.diagnostics import call_records, trace
from nbrpc.drawing import summary
from nbrpc.recording import clocks, recorder
from nbrpc.recording.ring import CAPACITY, Ring

# Workers cannot import this file: its functions travel by value, like a notebook's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

M, W1, W2 = "master", "worker1", "worker2"


# -- pure: halves, ring, merge, Chrome trace, summary --------------------------------


def caller(key, sent, replied=None, callee=W1, name="f", request=(0, 10), reply=None, **more):
    return {**dict(side="caller", key=key, t=sent, caller=key.rsplit(":", 1)[0], callee=callee,
                   kind="rpc_sync", name=name, sent=sent, replied=replied, request=list(request),
                   reply=reply, parent=None, context=None, rref=None, error=None), **more}


def callee(key, began, ended, thread="rpc-thread-1", reply=(0, 5), **more):
    return {**dict(side="callee", key=key, member=W1, t=began, began=began, ended=ended,
                   thread=thread, reply=list(reply) if reply else None, error=None), **more}


def member(name, rank, halves, evicted=()):
    return dict(name=name, id=rank, host="h", pid=100 + rank, clock="c", recording=True,
                halves=halves, evicted=list(evicted))


def test_merge_joins_halves_by_call_id_and_shifts_clocks():
    reports = [
        member(M, 0, [caller("master:0", 10.0, 10.5, request=(4000, 600)),
                      caller("master:1", 11.0, 11.2, callee=W2, name="g")]),
        # worker1's clock runs 100 s behind the driver's; worker2's call half is missing.
        member(W1, 1, [callee("master:0", 10.1 - 100, 10.3 - 100, reply=(4000, 170))]),
        member(W2, 2, []),
    ]
    snap = call_records.merge(reports, {W1: (100.0, 0.001)}, start=9.0, end=12.0)
    first, second = snap["calls"]
    assert first == {
        "id": "master:0", "caller": M, "callee": W1, "kind": "rpc_sync", "name": "f",
        "sent": 10.0, "began": pytest.approx(10.1), "ended": pytest.approx(10.3), "replied": 10.5,
        "thread": "rpc-thread-1", "request": {"tensor": 4000, "pickle": 600},
        "reply": {"tensor": 4000, "pickle": 170}, "parent": None, "context": None, "rref": None,
        "error": None}
    assert list(first) == list(call_records._RECORD_FIELDS)
    assert (second["name"], second["began"], second["ended"], second["thread"], second["reply"]) == \
        ("g", None, None, None, None)
    assert snap["clocks"] == [dict(worker=M, offset=0.0, bound=0.0),
                              dict(worker=W1, offset=100.0, bound=0.001),
                              dict(worker=W2, offset=0.0, bound=0.0)]
    assert [w["name"] for w in snap["workers"]] == [M, W1, W2]
    assert snap["dropped"] == 0
    json.dumps(snap)


def test_merge_window_orphans_and_errors():
    reports = [
        member(M, 0, [caller("master:0", 1.0, 1.1), caller("master:1", 5.0, 5.1),
                      caller("master:2", 6.0, 6.5, error="RuntimeError: torch's text")],
               evicted=[(0.5, 1), (4.5, 1), (4.6, 1)]),
        member(W1, 1, [callee("master:1", 5.01, 5.02), callee("master:2", 6.1, 6.2, error="ValueError: no"),
                       callee("master:9", 5.5, 5.6)]),  # its caller's half was lost
    ]
    snap = call_records.merge(reports, {}, start=4.0, end=7.0)
    assert [c["id"] for c in snap["calls"]] == ["master:1", "master:2"]
    # the callee's own exception wins over the caller's wrapping of it
    assert snap["calls"][1]["error"] == "ValueError: no"
    assert snap["dropped"] == 2 + 1  # evicted in the window, plus the orphan


def test_ring_keeps_the_last_halves_and_counts_the_rest():
    ring = recorder.Ring(3)
    for t in range(5):
        ring.add([f"master:{t}", float(t)])
    assert [h[1] for h in ring.since(None)] == [2.0, 3.0, 4.0]
    assert [h[1] for h in ring.since(3.0)] == [3.0, 4.0]
    assert list(ring.evicted) == [[0.0, 1], [1.0, 1]]
    assert ring.dropped(0.5, 10) == 1 and ring.dropped(0, 10) == 2
    for t in range(5, 100):
        ring.add([None, float(t)])
    assert len(ring.halves) == 3 and len(ring.evicted) == 3  # both bounded
    # evictions close together share a bucket: counted exactly, kept small
    ring = recorder.Ring(2)
    for i in range(1000):
        ring.add([None, 5.0 + i * 1e-6])
    assert ring.dropped(0, 10) == 998 and len(ring.evicted) == 1


def test_a_block_end_waits_a_little_for_replies_on_their_way(monkeypatch):
    """torch answers a ``to_here`` before the ``remote`` that made its value: a block's
    end waits for such replies, at most ``limit``, and never for gradients' halves
    (which get none) or calls from before the block."""
    monkeypatch.setattr(recorder.RECORDER, "ring", recorder.Ring(10))

    def half(kind, sent):
        h = [None] * (recorder.ID + 1)  # a caller half's slots
        h[recorder.T], h[recorder.SIDE], h[recorder.KIND] = sent, "caller", kind
        recorder.RECORDER.ring.add(h)
        return h

    remote, _, _ = half("remote", 5.0), half("autograd", 5.0), half("rpc_async", 1.0)
    threading.Timer(0.05, recorder.answered, (remote,)).start()
    began = time.monotonic()
    recorder.settle(2.0, limit=5.0)
    assert remote[recorder.REPLIED] is not None and time.monotonic() - began < 2.0
    half("rpc_async", 6.0)  # a reply that never comes costs the limit, no more
    began = time.monotonic()
    recorder.settle(2.0, limit=0.1)
    assert 0.1 <= time.monotonic() - began < 1.0


def check_chrome(doc: dict) -> dict:
    """Chrome's trace event format: every event has ph/ts/pid/tid, X has dur >= 0,
    flows come in s/f pairs, every pid and tid used is named."""
    events = doc["traceEvents"]
    assert events
    for e in events:
        assert {"ph", "ts", "pid", "tid"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    flows: dict = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            flows.setdefault((e["cat"], e["id"]), []).append(e["ph"])
    assert all(sorted(phs) == ["f", "s"] for phs in flows.values()), flows
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        if e["ph"] == "X":
            assert e["pid"] in named_pids and (e["pid"], e["tid"]) in named_tids
    # Each flow end lies inside a slice on its lane (Perfetto binds it there).
    for e in events:
        if e["ph"] in ("s", "f"):
            assert any(x["ph"] == "X" and (x["pid"], x["tid"]) == (e["pid"], e["tid"])
                       and x["ts"] <= e["ts"] <= x["ts"] + x["dur"] for x in events), e
    return flows


def test_chrome_trace_of_a_merged_snapshot():
    reports = [
        member(M, 0, [caller("master:0", 10.0, 10.5), caller("master:1", 10.1, 10.6, callee=W1),
                      caller("master:2", 11.0, 11.2, callee=W2)]),
        member(W1, 1, [callee("master:0", 10.1, 10.3), callee("master:1", 10.2, 10.4, thread="t2")]),
        member(W2, 2, []),
    ]
    doc = call_records.chrome_trace(call_records.merge(reports, {}, 9.0, 12.0))
    flows = check_chrome(doc)
    assert len(flows) == 4  # request and reply arrows of the two calls that ran
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    callers = [e for e in x if e["pid"] == 0]
    assert len(callers) == 3 and len({e["tid"] for e in callers}) == 2  # two overlap
    runs = [e for e in x if e["pid"] == 1]
    assert sorted((e["ts"], e["dur"]) for e in runs) == [
        (pytest.approx(1.1e6), pytest.approx(0.2e6)), (pytest.approx(1.2e6), pytest.approx(0.2e6))]
    json.dumps(doc)


def test_chrome_trace_arrows_stay_in_their_slices_when_clocks_disagree():
    # worker1's clock, aligned to the driver's within a few ms, says the run ended after
    # the driver had the reply, and began before the driver sent the request.
    reports = [member(M, 0, [caller("master:0", 10.002, 10.004, callee=W1)]),
               member(W1, 1, [callee("master:0", 10.001, 10.005)]), member(W2, 2, [])]
    flows = check_chrome(call_records.chrome_trace(call_records.merge(reports, {}, 9.0, 12.0)))
    assert len(flows) == 2


def test_chrome_trace_arrows_stay_in_their_slices_to_the_last_bit():
    # 93.405 + (499.901 - 93.405) is 499.90099999999995: a slice's end computed as
    # ts + dur falls short of its own end rounded on its own, by one bit.
    reports = [member(M, 0, [caller("master:0", 9.000093405, 9.000499901, callee=W1)]),
               member(W1, 1, [callee("master:0", 9.000093405, 9.000499901)]), member(W2, 2, [])]
    flows = check_chrome(call_records.chrome_trace(call_records.merge(reports, {}, 9.0, 12.0)))
    assert len(flows) == 2


def test_summary_rows():
    reports = [member(M, 0, [caller("master:0", 1.0, 1.5, request=(4000, 600)),
                             caller("master:1", 2.0, 2.1, request=(4000, 600)),
                             caller("master:2", 3.0, 3.2, callee=W2, name="g")]),
               member(W1, 1, [callee("master:0", 1.1, 1.2, reply=(4, 10))])]
    rows = summary.summarize(call_records.merge(reports, {}, 0.0, 10.0))
    assert [(r["name"], r["callee"], r["count"]) for r in rows] == [("f", W1, 2), ("g", W2, 1)]
    f = rows[0]
    assert f["total"] == pytest.approx(0.6) and f["median"] == pytest.approx(0.3)
    assert f["request_bytes"] == 2 * 4600 and f["reply_bytes"] == 14


def test_merge_leaves_out_nbrpc_own_calls_unless_asked():
    reports = [member(M, 0, [
        caller("master:0", 1.0, 1.1, name="train"),
        caller("master:2", 1.4, 1.5, name="_rref_typeof_on_owner", kind="internal"),
    ])]
    assert [c["name"] for c in call_records.merge(reports, {}, 0.0, 10.0)["calls"]] == ["train"]
    assert [c["name"] for c in call_records.merge(reports, {}, 0.0, 10.0, own=True)["calls"]] == [
        "train", "_rref_typeof_on_owner"]


def test_nbrpc_functions_are_nbrpc_calls_and_the_labs_are_the_students():
    from nbrpc.cluster import counts
    from nbrpc.lab import param_server
    from nbrpc.recording import functions

    assert functions.own(counts.member_counts)
    lab_function = next(f for f in vars(param_server).values()
                        if callable(f) and getattr(f, "__module__", "") == param_server.__name__)
    assert not functions.own(lab_function) and not functions.own(first)


def test_a_window_keeps_the_calls_that_straddle_its_start_and_those_in_flight():
    reports = [member(M, 0, [
        caller("master:0", 1.0, 2.0),  # over before the window
        caller("master:1", 3.0, 5.0),  # under way at its start (4.0)
        caller("master:2", 3.5, None),  # in flight: no reply yet
        caller("master:3", 4.5, 4.6),  # inside it
        caller("master:4", 11.0, 11.5),  # after it
        caller("master:5", 3.0, None, error="SerializationError: cannot pickle 'lock'"),  # never left
    ]), member(W1, 1, [callee("master:2", 3.6, None)])]
    ids = [c["id"] for c in call_records.merge(reports, {}, 4.0, 10.0, straddle=True)["calls"]]
    assert ids == ["master:1", "master:2", "master:3"]
    flying = call_records.merge(reports, {}, 4.0, 10.0, straddle=True)["calls"][1]
    assert (flying["began"], flying["ended"], flying["replied"]) == (3.6, None, None)
    # a trace block keeps only what was sent in it
    assert [c["id"] for c in call_records.merge(reports, {}, 4.0, 10.0)["calls"]] == ["master:3"]


def test_off_by_default_and_needs_a_cluster():
    assert nbrpc.Cluster(2).trace is False
    assert nbrpc.Cluster(2, trace=True).trace is True
    assert nbrpc.current() is None
    with pytest.raises(nbrpc.NoClusterError, match="start one with trace=True"):
        nbrpc.trace_snapshot()


# -- a real cluster --------------------------------------------------------------------



def add_one(x):
    return x + 1


def relay(x):
    """On worker1: a call to worker2 made while running this one."""
    return rpc.rpc_sync(W2, add_one, args=(x,))


def fail():
    raise ValueError("meant to fail")


class Counter:
    def __init__(self):
        self.n = 0

    def bump(self, k):
        self.n += k
        return self.n


def make_weights():
    return torch.ones(4, requires_grad=True)


def scaled(weights, x):
    return weights.local_value() * x


def shape(calls_made):
    return [(c["kind"], c["caller"], c["callee"], c["name"]) for c in calls_made]


def test_status_calls_stay_out_of_the_traced_timeline(traced):
    """%rpc_status asks every worker over RPC: nbrpc's own calls, not the user's to see."""
    began = clocks.now()
    rows = traced.status()  # what %rpc_status shows
    assert [r["name"] for r in rows] == [M, W1, W2]
    assert all(isinstance(r["busy"], int) for r in rows[1:])
    rpc.rpc_sync(W1, add_one, args=(1,))
    recent = nbrpc.trace_snapshot(last=clocks.now() - began + 0.01)
    assert shape(recent["calls"]) == [("rpc_sync", M, W1, "add_one")]


def test_a_known_sequence_gives_exactly_its_records(traced):
    x = torch.zeros(1000, dtype=torch.float32)
    with nbrpc.trace() as t:
        rpc.rpc_sync(W1, add_one, args=(x,))
        rpc.rpc_async(W2, add_one, args=(torch.zeros(10),)).wait()
        rpc.rpc_sync(W1, relay, args=(x,))
        with pytest.raises(ValueError, match="meant to fail"):
            rpc.rpc_sync(W2, fail)
        rref = rpc.remote(W2, add_one, args=(x,))
        assert rref.to_here()[0].item() == 1.0
    snap = t.snapshot()
    got = snap["calls"]
    assert shape(got) == [
        ("rpc_sync", M, W1, "add_one"), ("rpc_async", M, W2, "add_one"),
        ("rpc_sync", M, W1, "relay"), ("rpc_sync", W1, W2, "add_one"),
        ("rpc_sync", M, W2, "fail"), ("remote", M, W2, "add_one"), ("to_here", M, W2, "RREF_FETCH_CALL"),
    ]
    sync, async_, outer, inner, failed, remote, fetch = got
    # 1000 float32 = 4000 tensor bytes each way, the pickle around them apart
    assert sync["request"]["tensor"] == 4000 and sync["reply"]["tensor"] == 4000
    assert 0 < sync["request"]["pickle"] < 2000 and 0 < sync["reply"]["pickle"] < 1000
    assert async_["request"]["tensor"] == 40 and async_["reply"]["tensor"] == 40
    for c in (sync, async_, outer, inner, failed, remote):
        assert c["sent"] <= c["began"] <= c["ended"] <= c["replied"], c
        assert c["thread"]
    assert snap["start"] <= sync["sent"] and fetch["replied"] <= snap["end"]
    # nesting: worker1's call to worker2 ran inside the driver's call to worker1
    assert inner["parent"] == outer["id"] and outer["parent"] is None
    assert outer["began"] <= inner["sent"] and inner["replied"] <= outer["ended"]
    assert failed["error"] == "ValueError: meant to fail"
    assert [c["error"] for c in got if c is not failed] == [None] * 6
    # the RRef: made by remote, fetched by to_here, one id
    rid = nbrpc.recording.rref_ledger.rref_id(rref)
    assert remote["rref"] == fetch["rref"] == rid
    assert remote["reply"] is None  # the value stays with its owner
    assert fetch["reply"]["tensor"] == 4000 and fetch["request"] == {"tensor": 0, "pickle": 0}
    assert fetch["began"] is None  # torch's fetch runs no Python function on the owner
    assert len({c["id"] for c in got}) == len(got)
    assert [w["name"] for w in snap["workers"]] == [M, W1, W2]
    assert [(c["worker"], c["offset"], c["bound"]) for c in snap["clocks"]] == [
        (M, 0.0, 0.0), (W1, 0.0, 0.0), (W2, 0.0, 0.0)]
    assert snap["dropped"] == 0
    json.dumps(snap)


def logged(func):
    """A decorator: every function it wraps shares its wrapper's code object."""

    @functools.wraps(func)
    def wrapper(*args):
        return func(*args)

    return wrapper


@logged
def first(x):
    return x


@logged
def second(x):
    return x


def test_each_function_keeps_its_own_name(traced):
    """Names are looked up once per function: functions that share a decorator's code
    (and a method, a class, a builtin, a lambda) are still each named as themselves."""
    with nbrpc.trace() as t:
        for _ in range(2):
            rpc.rpc_sync(W1, first, args=(1,))
            rpc.rpc_sync(W1, second, args=(1,))
        rpc.rpc_sync(W1, Counter)
        rpc.rpc_sync(W1, Counter().bump, args=(1,))
        rpc.rpc_sync(W1, torch.add, args=(torch.ones(2), 1))
        rpc.rpc_sync(W1, lambda: 0)
    assert [c["name"] for c in t.snapshot()["calls"]] == [
        "first", "second", "first", "second", "Counter", "Counter.bump", "aten::add",
        "test_each_function_keeps_its_own_name.<locals>.<lambda>"]


def test_nbrpc_own_calls_stay_out_of_the_users_recording(traced):
    """%rpc_status, the RRef graph's snapshot and naming an RRef helper call make RPCs of
    nbrpc's own; a recording shows the user's calls only."""
    with nbrpc.trace() as t:
        rref = rpc.remote(W1, Counter)
        rref.rpc_sync().bump(1)
        nbrpc.current().status()
        nbrpc.rref_snapshot()
        rpc.rpc_sync(W2, first, args=(1,))
    names = [c["name"] for c in t.snapshot()["calls"]]
    assert names == ["Counter", "Counter.bump", "first"]
    assert [c["name"] for c in t.snapshot()["calls"] if c["kind"] == "nbrpc"] == []
    del rref


def nap(seconds):
    time.sleep(seconds)
    return seconds


def test_the_last_seconds_keep_a_call_in_flight_and_one_that_straddles_them(traced):
    """A live timeline's window: a call still running is in it (began, not ended), and
    stays in it after it ends, though it was sent before the window began."""
    fut = rpc.rpc_async(W1, nap, args=(1.5,))
    time.sleep(0.9)
    flying = [c for c in nbrpc.trace_snapshot(last=0.4)["calls"] if c["name"] == "nap"]
    assert len(flying) == 1 and flying[0]["began"] is not None, flying
    assert flying[0]["ended"] is None and flying[0]["replied"] is None
    assert fut.wait() == 1.5
    snap = nbrpc.trace_snapshot(last=0.4)
    (done,) = [c for c in snap["calls"] if c["id"] == flying[0]["id"]]
    assert done["sent"] < snap["start"] <= done["replied"] and done["ended"] is not None


def test_a_call_that_never_leaves_is_recorded_with_its_error(traced):
    """A call refused before its message exists (unknown worker, an argument that does
    not pickle) leaves an error record; a builtin, whose message torch writes itself,
    is not given the bytes of the next pickle (here the end of the block's), and runs
    no Python function on the callee."""
    x = torch.zeros(1000, dtype=torch.float32)
    with nbrpc.trace() as t:
        rpc.rpc_sync(W1, add_one, args=(x,))
        with pytest.raises(nbrpc.UnknownWorkerError):
            rpc.rpc_sync("nobody", add_one, args=(x,))
        with pytest.raises(nbrpc.SerializationError):
            rpc.rpc_async(W1, add_one, args=(threading.Lock(),))
        rpc.rpc_sync(W1, torch.add, args=(torch.ones(2), 1))
    got = t.snapshot()["calls"]
    assert [(c["callee"], c["name"], c["began"] is None) for c in got] == [
        (W1, "add_one", False), ("nobody", "add_one", True), (W1, "add_one", True), (W1, "aten::add", True)]
    assert got[1]["error"].startswith("UnknownWorkerError: no worker named 'nobody'")
    assert got[2]["error"].startswith("SerializationError: ")
    assert [c["request"]["tensor"] for c in got] == [4000, 0, 0, 8]
    assert 0 < got[0]["request"]["pickle"] < 2000 and got[3]["request"]["pickle"] == 0
    assert got[0]["error"] is None and got[3]["error"] is None


def summing(tensor):
    def total():
        return tensor.sum().item()

    return total


def test_recording_keeps_no_function_alive(traced):
    """A closure made for one call (and what it holds) is freed after the call: the
    records keep its name, never the function."""
    held = torch.zeros(1000)
    alive = weakref.ref(held)
    with nbrpc.trace() as t:
        assert rpc.rpc_sync(W1, summing(held)) == 0.0
    del held
    gc.collect()
    assert alive() is None
    assert [c["name"] for c in t.snapshot()["calls"]] == ["summing.<locals>.total"]


def test_rref_helpers(traced):
    counter = rpc.remote(W1, Counter)
    counter.rpc_sync().bump(1)  # the first helper asks the owner for the type once
    with nbrpc.trace() as t:
        assert counter.rpc_sync().bump(2) == 3
        assert counter.rpc_async().bump(3).wait() == 6
        counter.remote().bump(4).to_here()
    got = t.snapshot()["calls"]
    rid = nbrpc.recording.rref_ledger.rref_id(counter)
    helpers = [c for c in got if c["kind"] == "rref_helper"]
    assert [(c["callee"], c["name"], c["rref"]) for c in helpers] == [(W1, "Counter.bump", rid)] * 3
    assert all(c["began"] is not None and c["reply"] is not None for c in helpers[:2])
    assert [c["kind"] for c in got] == ["rref_helper", "rref_helper", "rref_helper", "to_here"]


def test_backward_and_optimizer_step(traced):
    weights = rpc.remote(W1, make_weights)
    optimizer = DistributedOptimizer(torch.optim.SGD, [weights], lr=0.1)
    with nbrpc.trace() as t:
        with dist_autograd.context() as context_id:
            x = torch.ones(4, requires_grad=True)
            y = rpc.rpc_sync(W1, scaled, args=(weights, x))
            z = rpc.rpc_sync(W2, torch.mul, args=(y, 2))
            dist_autograd.backward(context_id, [z.sum()])
            optimizer.step(context_id)
    got = t.snapshot()["calls"]
    assert shape(got) == [
        ("rpc_sync", M, W1, "scaled"), ("rpc_sync", M, W2, "aten::mul"),
        # gradients go back the way the tensors came: to worker2, then worker2 -> driver,
        # driver -> worker1 (y's sender), worker1 -> driver (x's)
        ("autograd", M, W2, recorder.GRADIENTS), ("autograd", W2, M, recorder.GRADIENTS),
        ("autograd", M, W1, recorder.GRADIENTS), ("autograd", W1, M, recorder.GRADIENTS),
        ("optimizer", M, W1, step_name(functional_step(optimizer))),
    ]
    assert {c["context"] for c in got} == {context_id}
    for c in got:
        if c["kind"] == "autograd":
            assert c["request"]["tensor"] == 16 and c["began"] is not None
            assert c["sent"] <= c["began"] <= c["ended"]
    assert torch.allclose(rpc.rpc_sync(W1, torch.clone, args=(weights.to_here(),)),
                          torch.full((4,), 1 - 0.1 * 2))


def step_name(step: str) -> str:
    """How the timeline names an optimizer step: TorchScript's function (before torch 2.15)
    by its qualified name, a Python function (2.15's) by its own."""
    return f"torch.distributed.optim.optimizer.{step}" if step.startswith("_script") else step


def functional_step(optimizer) -> str:
    """The step this torch sends for a functional optimizer (SGD is one): TorchScript's before
    torch 2.15, plain Python's from 2.15."""
    assert optimizer.is_functional_optim
    (step,) = [n for n in optimizer_steps_sent() if n != "_local_optimizer_step"]
    return step


def _keep_halves(capacity: int) -> None:
    """Keep ``capacity`` halves in this member (emptying its ring)."""
    recorder.RECORDER.ring = Ring(capacity)


def test_trace_snapshot_of_a_traced_cluster_and_its_ring(traced):
    rpc.rpc_sync(W1, add_one, args=(torch.zeros(2),))
    time.sleep(0.2)
    began = clocks.now()
    rpc.rpc_sync(W2, add_one, args=(torch.zeros(2),))
    recent = nbrpc.trace_snapshot(last=clocks.now() - began + 0.01)
    assert shape(recent["calls"]) == [("rpc_sync", M, W2, "add_one")]
    assert len(nbrpc.trace_snapshot()["calls"]) > 10

    # Rings of 50 halves: 200 calls keep the last 50 on each side, the rest counted.
    ask_members(_keep_halves, (50,))
    try:
        with nbrpc.trace() as t:
            for _ in range(200):
                rpc.rpc_sync(W1, add_one, args=(1,))
        snap = t.snapshot()
        assert len(snap["calls"]) == 50
        assert snap["dropped"] == 150 * 2  # each side lost 150 halves
        assert [c["began"] is not None for c in snap["calls"]] == [True] * 50
        assert all(len(r["halves"]) <= 50 for r in trace.gather(None, {}))
    finally:
        ask_members(_keep_halves, (CAPACITY,))


def test_chrome_trace_of_real_calls(traced, tmp_path):
    with nbrpc.trace() as t:
        rpc.rpc_sync(W1, relay, args=(torch.ones(3),))
        futures = [rpc.rpc_async(W2, add_one, args=(i,)) for i in range(5)]
        [f.wait() for f in futures]
    path = t.save(tmp_path / "trace.json")
    doc = json.loads(path.read_text())
    check_chrome(doc)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {M, W1, W2}
    runs = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "run"]
    assert sorted(e["name"] for e in runs) == ["add_one"] * 6 + ["relay"]
    rows = t.summary()
    assert [(r["name"], r["callee"], r["count"]) for r in rows if r["name"] == "add_one"] == [
        ("add_one", W2, 6)]
    with pytest.raises(ValueError, match="ending in .json"):
        t.save(tmp_path / "trace.txt")


def test_perfetto_opens_the_trace(traced, tmp_path):
    """Perfetto's trace processor reads the file's slices, where it can run: it needs the
    ``perfetto`` package and its binary (fetched from the internet on first use, or
    named by ``PERFETTO_TRACE_PROCESSOR``)."""
    try:
        from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
    except ImportError as e:
        pytest.skip(f"perfetto is not installed: {e}")
    with nbrpc.trace() as t:
        [rpc.rpc_async(W2, add_one, args=(i,)).wait() for i in range(3)]
    path = t.save(tmp_path / "trace.json")
    try:
        config = TraceProcessorConfig(bin_path=os.environ.get("PERFETTO_TRACE_PROCESSOR"), load_timeout=30)
        processor = TraceProcessor(trace=str(path), config=config)
    except Exception as e:
        pytest.skip(f"Perfetto's trace processor cannot run here: {type(e).__name__}: {e}")
    try:
        names = [row.name for row in processor.query("select name from slice")]
        flows = next(iter(processor.query("select count(*) as n from flow"))).n
    finally:
        processor.close()
    # per call: the caller's bar, the callee's run, an arrow there and one back
    assert names.count("add_one -> worker2") == names.count("add_one") == 3
    assert flows == 6


def test_html_report_is_written_with_no_writer_to_set_and_a_bad_suffix_says_what_to_do(traced, tmp_path):
    """The report page is drawn by ``nbrpc.drawing`` directly: no writer is set by the
    package first (a script that imports only the diagnostics writes one too)."""
    with nbrpc.trace() as t:
        rpc.rpc_sync(W1, add_one, args=(1,))
    page = t.save(tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "add_one" in page and "<svg" in page
    assert not hasattr(trace, "set_report_writer")
    with pytest.raises(ValueError, match=r"give a path ending in \.json .* or \.html"):
        t.save(tmp_path / "trace.txt")
    assert not (tmp_path / "trace.txt").exists()


def test_clock_offset_is_estimated_and_corrected(traced):
    """worker1's clock set 5 s ahead: it is measured, and its times corrected."""
    rpc.rpc_sync(W1, clocks.set_skew, args=(5.0,))
    try:
        offset, bound = clocks.estimate(W1)
        assert offset == pytest.approx(-5.0, abs=bound + 1e-3) and 0 < bound < 0.05
        with nbrpc.trace() as t:
            for _ in range(5):
                rpc.rpc_sync(W1, add_one, args=(1,))
        snap = t.snapshot()
        est = {c["worker"]: c for c in snap["clocks"]}
        assert est[W1]["offset"] == pytest.approx(-5.0, abs=est[W1]["bound"] + 1e-3)
        assert est[W2]["offset"] == 0.0 and est[W2]["bound"] == 0.0
        for c in snap["calls"]:
            slack = est[W1]["bound"]
            assert c["sent"] - slack <= c["began"] <= c["ended"] <= c["replied"] + slack, c
    finally:
        rpc.rpc_sync(W1, clocks.set_skew, args=(0.0,))
