"""RRef tracking on a real cluster: the worked example, forks, fetches, deletes, counts."""

from __future__ import annotations

import gc
import os
import sys

import cloudpickle
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import wait_gone, wait_until

import nbrpc
from nbrpc.diagnostics import rrefs
from nbrpc.recording import rref_ledger

# Workers cannot import this file: its functions travel by value, like a notebook's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def ring():
    """Driver (master, as p0) plus p1..p4, as in the worked example."""
    c = nbrpc.start(names=["p1", "p2", "p3", "p4"], progress=None, timeout=30)
    pids = [w.pid for w in c.workers]
    yield c
    c.shutdown()
    assert not wait_gone(pids)


def load_a():
    return torch.ones(2, 3)


def load_b():
    return torch.full((2, 3), 2.0)


def rref_add(x, y):
    return x.to_here() + y.to_here()


def make_local(n):
    return rpc.RRef(torch.arange(n))


def owned_counts() -> dict[str, int]:
    """torch's own count of OwnerRRefs in every member."""
    return {r["name"]: r["owned"] for r in rrefs.gather()}


def settle(check, timeout: float = 10.0):
    """Wait until ``check()`` is true: deletes reach owners asynchronously."""

    def collected() -> bool:
        gc.collect()
        return check()

    return wait_until(collected, timeout)


def fork_events(snapshot, ids):
    return {(e["rref"], e["from"], e["to"]) for e in snapshot["events"]
            if e["kind"] == "fork" and e["rref"] in ids}


def test_worked_example(ring):
    ra = rpc.remote("p1", load_a)
    rb = rpc.remote("p2", load_b)
    rc = rpc.remote("p3", rref_add, args=(ra, rb))
    rd = rpc.remote("p4", rref_add, args=(rc, rc))
    assert torch.equal(rd.to_here(), torch.full((2, 3), 6.0))
    assert settle(lambda: len(nbrpc.rref_snapshot()["rrefs"]) == 4)
    snap = nbrpc.rref_snapshot()
    ids = [rref_ledger.rref_id(r) for r in (ra, rb, rc, rd)]
    table = {r["id"]: r for r in snap["rrefs"]}
    assert sorted(table) == sorted(ids)
    for rid, owner in zip(ids, ["p1", "p2", "p3", "p4"]):
        row = table[rid]
        assert (row["owner"], row["creator"], row["holders"]) == (owner, "master", ["master"])
        assert (row["type"], row["summary"], row["size"]) == ("Tensor", "Tensor[2, 3] float32", 24)
        assert row["confirmed"] is True
        assert "rpc.remote(" in row["call_site"]
    ra_id, rb_id, rc_id, rd_id = ids
    assert fork_events(snap, ids) == {(ra_id, "master", "p3"), (rb_id, "master", "p3"),
                                      (rc_id, "master", "p4")}
    creates = {(e["rref"], e["from"], e["to"]) for e in snap["events"] if e["kind"] == "create"}
    assert creates >= {(ra_id, "master", "p1"), (rb_id, "master", "p2"),
                       (rc_id, "master", "p3"), (rd_id, "master", "p4")}
    assert {n: c for n, c in owned_counts().items() if c} == {"p1": 1, "p2": 1, "p3": 1, "p4": 1}

    del ra, rb, rc, rd
    assert settle(lambda: not nbrpc.rref_snapshot()["rrefs"])
    assert settle(lambda: not any(owned_counts().values()))
    deletes = {e["rref"] for e in nbrpc.rref_snapshot()["events"] if e["kind"] == "delete"}
    assert deletes >= set(ids)


def test_owner_counts_match_torch(ring):
    kept = [rpc.remote(f"p{1 + i % 4}", torch.zeros, args=((i + 1,),)) for i in range(10)]
    for r in kept:
        r.to_here()
    assert settle(lambda: sum(owned_counts().values()) == 10)
    snap = nbrpc.rref_snapshot()
    by_owner: dict[str, int] = {}
    for row in snap["rrefs"]:
        by_owner[row["owner"]] = by_owner.get(row["owner"], 0) + 1
    assert by_owner == {n: c for n, c in owned_counts().items() if c}
    assert by_owner == {"p1": 3, "p2": 3, "p3": 2, "p4": 2}
    del kept, r
    assert settle(lambda: not any(owned_counts().values()))


def test_rref_returned_from_a_call_is_a_fork_from_its_owner(ring):
    got = rpc.rpc_sync("p2", make_local, args=(5,))
    rid = rref_ledger.rref_id(got)
    snap = nbrpc.rref_snapshot()
    row = next(r for r in snap["rrefs"] if r["id"] == rid)
    assert (row["owner"], row["creator"], row["holders"]) == ("p2", "p2", ["master"])
    assert (row["summary"], row["size"], row["confirmed"]) == ("Tensor[5] int64", 40, True)
    assert (rid, "p2", "master") in fork_events(snap, {rid})
    assert torch.equal(got.to_here(), torch.arange(5))
    fetches = [e for e in nbrpc.rref_snapshot()["events"] if e["kind"] == "fetch" and e["rref"] == rid]
    assert [(e["from"], e["to"]) for e in fetches] == [("p2", "master")]
    del got
    assert settle(lambda: rid not in {r["id"] for r in nbrpc.rref_snapshot()["rrefs"]})


def test_local_rref_and_module_summaries(ring):
    local = rpc.RRef(torch.ones(3, dtype=torch.float64))
    model = rpc.remote("p3", torch.nn.Linear, args=(3, 4))
    snap = {r["id"]: r for r in nbrpc.rref_snapshot()["rrefs"]}
    mine = snap[rref_ledger.rref_id(local)]
    assert (mine["owner"], mine["creator"], mine["holders"]) == ("master", "master", ["master"])
    assert (mine["summary"], mine["size"], mine["confirmed"]) == ("Tensor[3] float64", 24, True)
    remote_model = snap[rref_ledger.rref_id(model)]
    assert (remote_model["type"], remote_model["summary"]) == ("Linear", "Linear (16 parameters)")
    assert remote_model["size"] == 16 * 4
    del local, model


def returned(x):
    return x


def test_a_remotes_rref_is_entered_late_and_keeps_its_events(ring):
    # remote() takes only the RRef's repr (between a remote and its to_here, work delays
    # the fetch); the rest is entered as it is reported, or a fork arrives. A fetch leaves
    # it as it is, one record beside it.
    led = rref_ledger._ledger
    nbrpc.rref_snapshot()  # enters what earlier tests left
    kept = rpc.remote("p1", load_a)
    dropped = rpc.remote("p2", load_b)
    rid, gone = rref_ledger.rref_id(kept), rref_ledger.rref_id(dropped)
    assert {r() for r in led.fresh} == {kept, dropped}
    assert not {id(kept), id(dropped)} & led.refs.keys()
    assert torch.equal(kept.to_here(), load_a()) and torch.equal(dropped.to_here(), load_b())
    assert {r() for r in led.fresh} == {kept, dropped}
    del dropped  # dropped before anything entered it: one record of its life
    assert [r() for r in led.fresh] == [kept]
    snap = nbrpc.rref_snapshot()  # a report enters what is left
    assert not led.fresh
    row = next(r for r in snap["rrefs"] if r["id"] == rid)
    assert (row["owner"], row["holders"]) == ("p1", ["master"])
    assert "test_rrefs.py line" in row["call_site"] and "load_a" in row["call_site"]
    events = [(e["kind"], e["from"], e["to"]) for e in snap["events"] if e["rref"] == gone]  # by time
    assert events == [("create", "master", "p2"), ("fetch", "p2", "master"), ("delete", "master", "p2")]
    fetches = [(e["from"], e["to"]) for e in snap["events"] if e["rref"] == rid and e["kind"] == "fetch"]
    assert fetches == [("p1", "master")]
    # A fire-and-forget loop keeps nothing waiting: each RRef leaves as it dies.
    for _ in range(50):
        rpc.remote("p3", load_a)
    assert not led.fresh
    del kept
    assert settle(lambda: rid not in {r["id"] for r in nbrpc.rref_snapshot()["rrefs"]})


def test_a_local_values_rref_dropped_unseen_leaves_its_two_events(ring):
    led = rref_ledger._ledger
    nbrpc.rref_snapshot()
    value = torch.ones(2)
    kept, dropped = rpc.RRef(value), rpc.RRef(value)
    kept_id, gone = rref_ledger.rref_id(kept), rref_ledger.rref_id(dropped)
    assert {r() for r in led.fresh} == {kept, dropped}
    del dropped
    # kept's fork comes back from p1: the fork enters kept first, two objects of one id.
    back = rpc.rpc_sync("p1", returned, args=(kept,))
    assert not led.fresh and led.alive[kept_id] == 2
    del back
    assert settle(lambda: led.alive.get(kept_id) == 1)
    snap = nbrpc.rref_snapshot()
    row = next(r for r in snap["rrefs"] if r["id"] == kept_id)
    assert row["owner"] == "master" and "kept, dropped = rpc.RRef(value)" in row["call_site"]
    events = [(e["kind"], e["from"], e["to"]) for e in snap["events"] if e["rref"] == gone]
    assert events == [("create", "master", "master"), ("delete", "master", "master")]
    created = next(e for e in snap["events"] if e["rref"] == kept_id and e["kind"] == "create")
    assert created["from"] == created["to"] == "master"
    del kept
    assert settle(lambda: kept_id not in led.alive)


def test_a_remotes_rref_made_before_a_reset_stays_out_of_the_new_ledger():
    class Made:  # a stand-in: made() reads only an RRef's repr
        def __repr__(self):
            return ("UserRRef(RRefId = GloballyUniqueId(created_on=0, local_id=7), "
                    "ForkId = GloballyUniqueId(created_on=0, local_id=8))")

    led = rref_ledger._Ledger()
    early, late, unseen = Made(), Made(), Made()
    led.made(early, 1, None)
    led.reset()  # a new cluster
    led.made(late, 1, None)
    del early
    assert not led.refs and not led.alive and not led.events
    led.enter_made()
    assert led.alive == {"0:7": 1} and [e[1:] for e in led.read_events()] == [("create", "0:7", -1, 1)]
    del late
    assert not led.alive and [e[1] for e in led.read_events()] == ["create", "delete"]
    led.made(unseen, 1, None)
    del unseen  # never entered: its life, read as two events
    assert not led.alive and [e[1:] for e in led.read_events()[2:]] == [("create", "0:7", -1, 1),
                                                                          ("delete", "0:7", -1, 1)]


def test_snapshot_lists_every_member(ring):
    snap = nbrpc.rref_snapshot()
    assert [w["name"] for w in snap["workers"]] == ["master", "p1", "p2", "p3", "p4"]
    assert [w["id"] for w in snap["workers"]] == sorted(w["id"] for w in snap["workers"])
    assert snap["workers"][0]["pid"] == os.getpid()
    assert {w["pid"] for w in snap["workers"][1:]} == {w.pid for w in ring.workers}


def test_memory_stays_bounded_over_100k_rrefs(ring):
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    value = torch.zeros(1)
    for _ in range(2_000):  # warm up allocators
        rpc.RRef(value)
    before = rss_mb()
    for _ in range(100_000):
        rpc.RRef(value)
    grown = rss_mb() - before
    assert not rref_ledger._ledger.refs and not rref_ledger._ledger.alive
    assert len(rref_ledger._ledger.events) == rref_ledger.EVENTS_KEPT
    assert grown < 20, f"resident memory grew {grown:.1f} MB over 100,000 RRefs"


def test_merge_combines_holders_and_fills_summaries():
    def report(name, wid, held, events=()):
        return dict(name=name, id=wid, host="h", pid=wid + 100, tracking=True,
                    held=held, events=list(events), owned=0)

    row = dict(id="0:1", owner=1, type=None, summary=None, size=None, call_site=None,
               confirmed=False)
    snap = rrefs.merge([
        report("a", 0, [dict(row, call_site="cell line 1: x")], [(2.0, "create", "0:1", 0, 1)]),
        report("b", 1, []),
        report("c", 2, [dict(row, type="Tensor", summary="Tensor[1] float32", size=4,
                             confirmed=True)], [(1.0, "fork", "0:1", 0, 2)]),
    ])
    assert snap["rrefs"] == [dict(id="0:1", owner="b", creator="a", holders=["a", "c"],
                                  type="Tensor", summary="Tensor[1] float32", size=4,
                                  call_site="cell line 1: x", confirmed=True)]
    assert [e["kind"] for e in snap["events"]] == ["fork", "create"]
    assert snap["events"][0] == {"t": 1.0, "kind": "fork", "rref": "0:1", "from": "a", "to": "c"}
