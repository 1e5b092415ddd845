"""A notebook class's instance goes in C (``c_pickling.instance_reduction``) once its
receiver holds the class: its class by identity and its ``__dict__``; it arrives as the
kept pickler's ``copyreg.__newobj__`` would make it, by every form of call and in the
reply, and a class that reduces its instances otherwise still goes the kept way."""

from __future__ import annotations

import pytest
from conftest import run

from nbrpc.wire import c_pickling
from nbrpc.wire.cloudpickling import RpcPickler

CLASSES = """
class Spot:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def total(self):
        return self.x + self.y

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

def asked_here():
    names = [type(obj).__name__ for obj in asked_on_worker]
    asked_on_worker.clear()
    return names
"""
# On worker1: what its kept pickler is asked about (its replies), as ``asked`` here.
WATCH = """
from nbrpc.wire.cloudpickling import RpcPickler
asked_on_worker = []
_reducer_override = RpcPickler.reducer_override
RpcPickler.reducer_override = lambda self, obj: asked_on_worker.append(obj) or _reducer_override(self, obj)
"""


@pytest.fixture
def asked(shell, monkeypatch) -> list:
    """The objects the kept pickler's ``reducer_override`` is asked about, from now on."""
    seen: list = []
    reducer = RpcPickler.reducer_override
    monkeypatch.setattr(RpcPickler, "reducer_override", lambda self, obj: seen.append(obj) or reducer(self, obj))
    return seen


@pytest.fixture(scope="module", autouse=True)
def classes(shell, cluster):
    """The classes, held by worker1 (an instance of each sent there once), which watches
    its kept pickler."""
    run(shell, CLASSES)
    run(shell, "spot = Spot(1, 2.5)\n"
               "rpc.rpc_sync('worker1', echo_back, args=(spot, Spot3(1, 2, 3), Blank(), RestoredSpot(1)))")
    run(shell, "rpc.rpc_sync('worker1', spot_facts, args=(spot,))")
    cluster.run(WATCH, "worker1")


def _asked_on_worker1(shell) -> list[str]:
    """The type names worker1's kept pickler was asked about since the last look."""
    return run(shell, "rpc.rpc_sync('worker1', asked_here)")


def test_an_instance_goes_in_c_and_arrives_with_the_receivers_class_and_its_state(shell, asked):
    first = run(shell, 'rpc.rpc_sync("worker1", spot_facts, args=(Spot(1, 2.5),))')
    asked.clear()
    forms = {
        "rpc_sync": 'rpc.rpc_sync("worker1", spot_facts, args=(Spot(3, torch.ones(2)),))',
        "rpc_async": 'rpc.rpc_async("worker1", spot_facts, args=(Spot(3, torch.ones(2)),)).wait()',
        "remote": 'rpc.remote("worker1", spot_facts, args=(Spot(3, torch.ones(2)),)).to_here()',
    }
    for form, code in forms.items():
        name, class_id, state = run(shell, code)
        assert (name, class_id) == ("Spot", first[1]), form  # one class there, by identity
        assert [k for k, _ in state] == ["x", "y"] and state[0][1] == 3 and state[1][1].tolist() == [1.0, 1.0]
    assert not asked, f"the kept pickler was asked about {asked}"


def test_a_reply_of_instances_comes_home_as_the_callers_classes_in_c(shell, asked):
    _asked_on_worker1(shell)
    asked.clear()
    point, deeper, empty, restored = run(
        shell, "rpc.rpc_sync('worker1', echo_back, args=(spot, Spot3(1, 2, 3), Blank(), RestoredSpot(7)))")
    assert _asked_on_worker1(shell) == [], "worker1's kept pickler pickled the reply"
    user = shell.user_ns
    assert type(point) is user["Spot"] and (point.x, point.y, point.total()) == (1, 2.5, 3.5)
    assert type(deeper) is user["Spot3"] and (deeper.x, deeper.y, deeper.z) == (1, 2, 3)
    assert type(empty) is user["Blank"] and vars(empty) == {}
    # __setstate__ ran on arrival, on the worker and back here, as it runs for the kept pickler
    assert type(restored) is user["RestoredSpot"] and vars(restored) == {"x": 7, "restored": True}
    assert not asked, f"the kept pickler was asked about {asked}"


def test_one_object_twice_arrives_as_one_object_in_containers_and_keywords(shell, asked):
    values, named = run(shell, "once = Spot(1, 2)\n"
                               "rpc.rpc_sync('worker1', echo_back, args=(once, [once, {'q': once}]),"
                               " kwargs={'q': once})")
    same, (listed, keyed) = values
    assert same is listed is keyed["q"] is named["q"] and type(same) is shell.user_ns["Spot"]
    assert not asked, f"the kept pickler was asked about {asked}"


@pytest.mark.parametrize("made, expected", [
    ("SlottedSpot(4)", ("SlottedSpot", 4)),
    ("ReducedSpot(4)", ("ReducedSpot", 204)),  # its own __reduce__, there and back
    ("CountedSpot(a=1)", ("CountedSpot", {"a": 1})),
    ("InnerSpot(4)", ("InnerSpot", 4)),  # not a top-level class: goes in full each time
])
def test_a_class_that_reduces_otherwise_goes_the_kept_way_and_arrives_right(shell, asked, made, expected):
    _asked_on_worker1(shell)
    asked.clear()
    value = run(shell, f"rpc.rpc_sync('worker1', echo_back, args=({made},))[0]")
    assert type(value).__name__ == expected[0] and asked, "the kept pickler pickled it"
    assert expected[0] in _asked_on_worker1(shell), "worker1's kept pickler pickled the reply"
    got = dict(value) if expected[0] == "CountedSpot" else value.x
    assert got == expected[1]


def test_a_receiver_that_never_had_the_class_gets_it_in_full_then_by_identity(shell, asked):
    run(shell, "class FreshSpot:\n    def __init__(self, x):\n        self.x = x\n")
    asked.clear()
    assert run(shell, "rpc.rpc_sync('worker2', echo_back, args=(FreshSpot(1),))[0].x") == 1
    assert shell.user_ns["FreshSpot"] in asked  # sent in full by the kept pickler
    asked.clear()
    value = run(shell, "rpc.rpc_sync('worker2', echo_back, args=(FreshSpot(2),))[0]")
    assert type(value) is shell.user_ns["FreshSpot"] and value.x == 2 and not asked


def test_the_c_table_reduces_only_classes_whose_instances_reduce_as_objects_do(shell):
    user = shell.user_ns
    table = c_pickling.in_c_table({})
    assert table[user["Spot"]] is c_pickling.instance_reduction
    for name in ("SlottedSpot", "ReducedSpot", "CountedSpot"):
        with pytest.raises(KeyError):
            table[user[name]]
    with pytest.raises(KeyError):
        table[int]
