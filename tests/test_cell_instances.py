"""A notebook class's instance arrives as a script's would under raw torch: an instance of
the receiver's class (the caller's own, coming home), with its state (``__setstate__`` run
if it has one), one object however often a message holds it, by every form of call and
in the reply; so does one of a class with ``__slots__``, its own ``__reduce__``, a
``dict`` base or no top-level name."""

from __future__ import annotations

import pytest
from conftest import run

CLASSES = """
class Spot:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def total(self):
        return self.x + self.y

    def plus(self, other):
        return Spot(self.x + other.x, self.y + other.y)

class Spot3(Spot):
    def __init__(self, x, y, z):
        super().__init__(x, y)
        self.z = z

class Blank:
    pass

class RestoredSpot:
    def __init__(self, x):
        self.x = x

    def __setstate__(self, state):
        self.__dict__.update(state, restored=True)

class SlottedSpot:
    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

class ReducedSpot:
    def __init__(self, x):
        self.x = x

    def __reduce__(self):
        return ReducedSpot, (self.x + 100,)

class CountedSpot(dict):
    pass

def make_inner_spot():
    class InnerSpot:
        def __init__(self, x):
            self.x = x
    return InnerSpot

InnerSpot = make_inner_spot()

def echo_back(*values, **named):
    return values if not named else (values, named)

def spot_facts(p):
    return type(p).__name__, id(type(p)), sorted(vars(p).items())
"""


@pytest.fixture(scope="module", autouse=True)
def classes(shell):
    """The classes, held by worker1 (an instance of each sent there once)."""
    run(shell, CLASSES)
    run(shell, "spot = Spot(1, 2.5)\n"
               "rpc.rpc_sync('worker1', echo_back, args=(spot, Spot3(1, 2, 3), Blank(), RestoredSpot(1)))")


def test_an_instance_arrives_with_the_receivers_class_and_its_state_by_every_form(shell):
    first = run(shell, 'rpc.rpc_sync("worker1", spot_facts, args=(Spot(1, 2.5),))')
    forms = {
        "rpc_sync": 'rpc.rpc_sync("worker1", spot_facts, args=(Spot(3, torch.ones(2)),))',
        "rpc_async": 'rpc.rpc_async("worker1", spot_facts, args=(Spot(3, torch.ones(2)),)).wait()',
        "remote": 'rpc.remote("worker1", spot_facts, args=(Spot(3, torch.ones(2)),)).to_here()',
    }
    for form, code in forms.items():
        name, class_id, state = run(shell, code)
        assert (name, class_id) == ("Spot", first[1]), form  # one class there
        assert [k for k, _ in state] == ["x", "y"] and state[0][1] == 3 and state[1][1].tolist() == [1.0, 1.0]
    # through an RRef's proxy: an instance there, one as the argument, one in the reply
    total = run(shell, 'rpc.remote("worker1", Spot, args=(3, 4)).rpc_sync().plus(Spot(1, 1))')
    assert type(total) is shell.user_ns["Spot"] and (total.x, total.y) == (4, 5)


def test_a_reply_of_instances_comes_home_as_the_callers_classes(shell):
    point, deeper, empty, restored = run(
        shell, "rpc.rpc_sync('worker1', echo_back, args=(spot, Spot3(1, 2, 3), Blank(), RestoredSpot(7)))")
    user = shell.user_ns
    assert type(point) is user["Spot"] and (point.x, point.y, point.total()) == (1, 2.5, 3.5)
    assert type(deeper) is user["Spot3"] and (deeper.x, deeper.y, deeper.z) == (1, 2, 3)
    assert type(empty) is user["Blank"] and vars(empty) == {}
    # __setstate__ ran on arrival, on the worker and back here
    assert type(restored) is user["RestoredSpot"] and vars(restored) == {"x": 7, "restored": True}


def test_one_object_twice_arrives_as_one_object_in_containers_and_keywords(shell):
    values, named = run(shell, "once = Spot(1, 2)\n"
                               "rpc.rpc_sync('worker1', echo_back, args=(once, [once, {'q': once}]),"
                               " kwargs={'q': once})")
    same, (listed, keyed) = values
    assert same is listed is keyed["q"] is named["q"] and type(same) is shell.user_ns["Spot"]


@pytest.mark.parametrize("made, expected", [
    ("SlottedSpot(4)", ("SlottedSpot", 4)),  # real slots there and back (no __dict__ here)
    ("ReducedSpot(4)", ("ReducedSpot", 204)),  # its own __reduce__, there and back
    ("CountedSpot(a=1)", ("CountedSpot", {"a": 1})),
    ("InnerSpot(4)", ("InnerSpot", 4)),  # no top-level name: goes in full each time
])
def test_a_class_that_reduces_otherwise_arrives_right_both_ways(shell, made, expected):
    for _ in range(2):  # in full, then (a top-level class) by identity
        value = run(shell, f"rpc.rpc_sync('worker1', echo_back, args=({made},))[0]")
        assert type(value).__name__ == expected[0]
        assert (dict(value) if expected[0] == "CountedSpot" else value.x) == expected[1]
        if expected[0] != "InnerSpot":
            assert type(value) is shell.user_ns[expected[0]]


_COUNT_KEPT = """
from nbrpc.wire.cloudpickling import RpcPickler as _Kept
_kept_asked, _kept_reducer = [], _Kept.reducer_override
_Kept.reducer_override = lambda self, obj: _kept_asked.append(type(obj).__name__) or _kept_reducer(self, obj)
"""


def test_an_instance_of_a_held_class_is_pickled_all_in_c_both_ways(shell, cluster, monkeypatch):
    """An instance of a class its receiver holds (or made, in a reply), its state plain
    values, tensors, containers and such instances, takes no Python reducer of the kept
    pickler's on either side; one that reduces otherwise, holds a function, refers to
    itself or goes where its class is not held takes the kept pickler, and all arrive."""
    from nbrpc.wire.cloudpickling import RpcPickler

    asked = []
    reducer = RpcPickler.reducer_override
    monkeypatch.setattr(RpcPickler, "reducer_override", lambda self, obj: asked.append(obj) or reducer(self, obj))
    cluster.run(_COUNT_KEPT, "worker1")
    try:
        run(shell, "nested = Spot([1, torch.ones(2), {'k': (2.0, None)}], Spot3(1, 2, 3))\n"
                   "rpc.rpc_sync('worker1', echo_back, args=(nested,))")  # (echo_back held from here)
        asked.clear()
        cluster.run("_kept_asked.clear()", "worker1")
        (back,) = run(shell, "rpc.rpc_sync('worker1', echo_back, args=(nested,))")
        assert asked == []
        on_worker = run(shell, "rpc.rpc_sync('worker1', lambda: list(__import__('__main__')._kept_asked))")
        assert on_worker == [], on_worker
        assert type(back) is shell.user_ns["Spot"] and type(back.y) is shell.user_ns["Spot3"]
        assert back.x[0] == 1 and back.x[1].tolist() == [1.0, 1.0] and back.x[2] == {"k": (2.0, None)}
        run(shell, "looped = Spot(1, 2)\nlooped.me = looped")
        for made in ("SlottedSpot(4)", "ReducedSpot(4)", "CountedSpot(a=1)", "InnerSpot(4)",
                     "Spot(echo_back, 1)", "looped"):
            asked.clear()
            value = run(shell, f"rpc.rpc_sync('worker1', echo_back, args=({made},))[0]")
            assert asked, f"{made} took the C route"
            assert type(value).__name__ == made.split("(")[0].replace("looped", "Spot"), made
        assert value.me is value
        asked.clear()
        assert run(shell, "rpc.rpc_sync('worker2', spot_facts, args=(Spot(5, 6),))")[2] == [("x", 5), ("y", 6)]
        assert shell.user_ns["Spot"] in asked  # never sent to worker2: in full there
    finally:
        cluster.run("_Kept.reducer_override = _kept_reducer", "worker1")


def _origin_told(held_instances, instance) -> str | None:
    """The origin that the C route's reduction of ``instance`` names its class by, if it takes it."""
    found = held_instances.held(instance, type(instance))
    if found is None:
        return None
    key = found[1](instance)[1][0]  # (instance_of, (the class's key,), its fields)
    return key[0]  # (origin, token, 0)


def test_a_forked_child_tells_a_class_by_its_own_identity(shell):
    """A class's kind, kept per class, names its identity by this process's origin: a
    forked child (a new origin) tells it afresh."""
    import os

    from nbrpc.wire import definitions, held_instances
    from nbrpc.wire.receivers import receivers

    spot = shell.user_ns["Spot"](1, 2)
    receivers.going_home(definitions.REGISTRY.origin)  # as a reply to its maker is pickled
    try:
        assert _origin_told(held_instances, spot) == definitions.REGISTRY.origin
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            receivers.going_home(definitions.REGISTRY.origin)
            os.write(w, repr(_origin_told(held_instances, spot) == definitions.REGISTRY.origin).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 10) == b"True"
        os.close(r)
        os.close(w)
    finally:
        receivers.going_home(None)


FETCHED = """
class Fetched:
    def __init__(self, a, b):
        self.a, self.b = a, b

class FetchedToo:
    def __init__(self, c):
        self.c = c

def fetched_facts(rref):
    value = rref.to_here()
    return type(value).__name__, sorted(vars(value).items())

def fetched_parts(rref):
    value = rref.to_here()
    return type(value.b).__name__, value.b.c, float(value.a.sum())
"""


def test_an_rrefs_value_goes_to_any_fetcher_by_identity_or_again_in_full(shell, cluster):
    """A remote's value, an instance of a held class, goes to its fetcher with the class by
    identity, all in C on the owner, whoever fetches (the owner cannot tell); a fetcher
    that lacks the class (an RRef forked to it) fetches it again in full, and by identity
    after; a value holding an RRef, or of a class without weak references, takes the kept pickler."""
    run(shell, FETCHED)
    cluster.run(_COUNT_KEPT, "worker1")
    try:
        run(shell, "made = rpc.remote('worker1', Fetched, args=(1, 2.5))")
        cluster.run("_kept_asked.clear()", "worker1")
        here = run(shell, "made.to_here()")
        assert type(here) is shell.user_ns["Fetched"] and (here.a, here.b) == (1, 2.5)
        assert run(shell, "rpc.rpc_sync('worker1', lambda: list(__import__('__main__')._kept_asked))") == []
        # worker2 never got Fetched: the owner's reply names it by identity, worker2 fetches again
        for turn in ("in full", "by identity"):
            cluster.run("_kept_asked.clear()", "worker1")
            facts = run(shell, "rpc.rpc_sync('worker2', fetched_facts, args=(made,))")
            assert facts == ("Fetched", [("a", 1), ("b", 2.5)]), turn
            kept = run(shell, "rpc.rpc_sync('worker1', lambda: list(__import__('__main__')._kept_asked))")
            assert ("Fetched" in kept) == (turn == "in full"), (turn, kept)
        # worker2 lacks FetchedToo: it stops there, its 2 MiB tensor (shared memory) already unpickled
        cluster.run("_kept_asked.clear()", "worker1")
        parts = run(shell, "rpc.rpc_sync('worker2', fetched_parts, args=("
                           "rpc.remote('worker1', Fetched, args=(torch.ones(2**19), FetchedToo(5))),))")
        assert parts == ("FetchedToo", 5, 2.0**19)
        assert "FetchedToo" in run(shell, "rpc.rpc_sync('worker1', lambda: list(__import__('__main__')._kept_asked))")
        cluster.run("_kept_asked.clear()", "worker1")
        holder = run(shell, "inner = rpc.remote('worker1', torch.add, args=(torch.ones(2), 0))\n"
                            "rpc.remote('worker1', Fetched, args=(inner, 3)).to_here()")
        assert type(holder) is shell.user_ns["Fetched"] and holder.a.to_here().tolist() == [1.0, 1.0]
        assert "Fetched" in run(shell, "rpc.rpc_sync('worker1', lambda: list(__import__('__main__')._kept_asked))")
        slotted = run(shell, "rpc.remote('worker1', SlottedSpot, args=(4,)).to_here()")  # no weak reference to it
        assert type(slotted) is shell.user_ns["SlottedSpot"] and slotted.x == 4
    finally:
        cluster.run("_Kept.reducer_override = _kept_reducer", "worker1")
