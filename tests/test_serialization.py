"""Notebook definitions travel over the unmodified torch RPC API, in both directions.

Everything here is defined in the cells of a real IPython shell, whose namespace is
``__main__`` like a notebook's: the workers cannot import any of it, so it only works
if nbrpc ships it by value.
"""

from __future__ import annotations

import io
import pickle
import weakref

import pytest
import torch
from conftest import run
from torch.distributed.rpc import internal

import nbrpc
from nbrpc._compat import torch_compat
from nbrpc.calls import interrupts
from nbrpc.wire import c_pickling, cloudpickling, definitions, shared_tensors, signing
from nbrpc.wire.cloudpickling import RpcPickler
from nbrpc.wire.receivers import receivers


def pid_of(cluster, name: str) -> int:
    return next(w.pid for w in cluster.workers if w.name == name)


def test_cells_define_in_main_which_workers_cannot_import(shell):
    run(shell, "def where(): pass")
    assert shell.user_ns["where"].__module__ == "__main__"
    # torch's own pickler stores it by reference to __main__.where, which a worker lacks
    assert b"__main__" in pickle.dumps(shell.user_ns["where"])
    assert internal._pickler is RpcPickler


def test_lambda_as_target(shell, cluster):
    result = run(shell, """
lambda_result = rpc.rpc_sync("worker1", lambda x: (os.getpid(), x * 2 + 1), args=(torch.arange(3.0),))
lambda_result
""")
    pid, value = result
    assert pid == pid_of(cluster, "worker1")
    assert torch.equal(value, torch.tensor([1.0, 3.0, 5.0]))


def test_closure_over_a_local_with_rpc_async(shell, cluster):
    run(shell, """
def make_scaler(factor):
    offset = torch.tensor([0.5, -0.5])
    def scale(x):
        return os.getpid(), x * factor + offset
    return scale

scaled = rpc.rpc_async("worker2", make_scaler(5), args=(torch.ones(2),)).wait()
""")
    pid, value = shell.user_ns["scaled"]
    assert pid == pid_of(cluster, "worker2")
    assert torch.equal(value, torch.tensor([5.5, 4.5]))


def test_functions_as_arguments_and_return_values(shell):
    run(shell, """
def apply(fn, value):
    return fn(value)

def make_adder(n):
    return lambda x: x + n

squared = rpc.rpc_sync("worker1", apply, args=(lambda v: v ** 2, 7))
adder = rpc.rpc_sync("worker2", make_adder, args=(10,))
""")
    assert shell.user_ns["squared"] == 49
    adder = shell.user_ns["adder"]
    assert adder.__module__ == "__main__"
    assert adder(5) == 15


def test_class_instance_round_trip(shell):
    run(shell, """
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def moved(self, dx):
        return Point(self.x + dx, self.y)

    def norm2(self):
        return self.x ** 2 + self.y ** 2

moved = rpc.rpc_sync("worker1", Point.moved, args=(Point(1, 2), 3))
point_rref = rpc.remote("worker2", Point, args=(3, 4))
norm2 = point_rref.rpc_sync().norm2()
fetched = point_rref.to_here()
""")
    Point = shell.user_ns["Point"]
    moved = shell.user_ns["moved"]
    # The class comes back as the driver's own class, not a copy of it.
    assert type(moved) is Point
    assert (moved.x, moved.y) == (4, 2)
    assert shell.user_ns["point_rref"].owner().name == "worker2"
    assert shell.user_ns["norm2"] == 25
    fetched = shell.user_ns["fetched"]
    assert type(fetched) is Point and (fetched.x, fetched.y) == (3, 4)


def test_nn_module_subclass_created_remotely(shell, cluster):
    run(shell, """
class MyModule(nn.Module):
    def __init__(self, bias=1.0):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(6.0).reshape(2, 3))
            self.lin.bias.fill_(bias)

    def forward(self, x):
        return self.lin(x)

    def where(self):
        return os.getpid()

module_rref = rpc.remote("worker1", MyModule)
module_out = module_rref.rpc_sync().forward(torch.ones(3))
module_pid = module_rref.rpc_sync().where()
""")
    assert shell.user_ns["module_rref"].owner().name == "worker1"
    assert shell.user_ns["module_pid"] == pid_of(cluster, "worker1")
    assert torch.equal(shell.user_ns["module_out"].detach(), torch.tensor([4.0, 13.0]))


def test_module_with_kwargs_over_rpc_async_and_rref_passed_on(shell):
    run(shell, """
module_rref2 = rpc.remote("worker2", MyModule, kwargs={"bias": -1.0})
via_async = module_rref2.rpc_async().forward(torch.ones(3)).wait()
# An RRef as an argument: worker1 calls the module that lives on worker2.
via_other = rpc.rpc_sync(
    "worker1", lambda r, x: r.rpc_sync().forward(x), args=(module_rref2, torch.ones(3))
)
local_copy = module_rref2.to_here()
""")
    expected = torch.tensor([2.0, 11.0])
    assert torch.equal(shell.user_ns["via_async"].detach(), expected)
    assert torch.equal(shell.user_ns["via_other"].detach(), expected)
    local_copy = shell.user_ns["local_copy"]
    assert type(local_copy) is shell.user_ns["MyModule"]
    assert torch.equal(local_copy(torch.ones(3)).detach(), expected)


def test_worker_returns_instance_of_class_defined_on_the_worker(shell, cluster):
    cluster.run(
        """
class Point3:
    def __init__(self, x, y, z):
        self.x, self.y, self.z = x, y, z

    def total(self):
        return self.x + self.y + self.z

def make_point():
    return Point3(1, 2, 3)
""",
        "worker1",
    )
    run(shell, 'from_worker = rpc.rpc_sync("worker1", lambda: __import__("__main__").make_point())')
    point = shell.user_ns["from_worker"]
    assert type(point).__name__ == "Point3"
    # worker1 stored it under its name; so does the driver, which had no Point3
    assert shell.user_ns["Point3"] is type(point)
    assert (point.x, point.y, point.z) == (1, 2, 3)
    assert point.total() == 6
    # ...and it goes back to the worker as the worker's own class.
    run(shell, """
same_class = rpc.rpc_sync(
    "worker1", lambda p: type(p) is __import__("__main__").Point3, args=(from_worker,)
)
""")
    assert shell.user_ns["same_class"] is True


def test_tensors_stay_out_of_the_pickle_stream(shell):
    run(shell, """
big = torch.randn(10 * 2**20 // 4)  # 10 MB of float32
def total(t):
    return t.sum()
holds_big = lambda: big.sum()
""")
    big = shell.user_ns["big"]
    assert big.nbytes == 10 * 2**20
    pickler = internal._internal_rpc_pickler
    cases = {
        "argument": internal.PythonUDF(shell.user_ns["total"], (big,), {}),
        "closure": internal.PythonUDF(shell.user_ns["holds_big"], (), {}),
        "class instance": internal.PythonUDF(shell.user_ns["Point"], (big, 0), {}),
    }
    # torch's path (test_shared_tensors has the shared memory one, which a local cluster takes)
    was = shared_tensors.is_enabled()
    shared_tensors.enable(False)
    try:
        for what, udf in cases.items():
            payload, tensors = pickler.serialize(udf)
            assert len(payload) < 20_000, f"{what}: {len(payload)} bytes pickled"
            assert any(t is big for t in tensors), f"{what}: tensor not in the tensor table"
    finally:
        shared_tensors.enable(was)
    # and the whole tensor arrives intact
    assert torch.equal(run(shell, 'rpc.rpc_sync("worker2", lambda t: t.clone(), args=(big,))'), big)


def test_each_thread_keeps_one_pickler_which_holds_nothing_after_a_message(shell):
    run(shell, """
class Held:
    def __init__(self, size):
        self.data = list(range(size))

def measure(held, t):
    return len(held.data) + t.sum()
""")
    pickler = internal._internal_rpc_pickler
    held, small = shell.user_ns["Held"](5), torch.ones(3)
    udf = internal.PythonUDF(shell.user_ns["measure"], (held, small), {})
    payload, tensors = pickler.serialize(udf)
    kept = cloudpickling.kept()
    # the same bytes and tensors as torch's serialize with a new RpcPickler
    assert (payload, tensors) == torch_compat.torch_serialize(pickler, udf)
    assert pickler.serialize(udf)[0] == payload and cloudpickling.kept() is kept
    gone = weakref.ref(held)
    del udf, held
    assert gone() is None, "the kept pickler still holds a value of its last message"
    value = pickler.deserialize(payload, tensors)
    assert value.func(*value.args) == 8


class _PicklesAnother:
    """Pickling it pickles another message inside (on the same thread)."""

    def __reduce__(self):
        inner, tensors = internal._internal_rpc_pickler.serialize(("inner", torch.zeros(2)))
        return _unwrap, (inner, tensors)


def _unwrap(inner, tensors):
    return internal._internal_rpc_pickler.deserialize(inner, tensors)


def test_a_message_pickled_inside_another_gets_its_own_pickler(cluster):
    pickler = internal._internal_rpc_pickler
    payload, tensors = pickler.serialize(["outer", _PicklesAnother(), torch.ones(1)])
    outer, (word, zeros), ones = pickler.deserialize(payload, tensors)
    assert (outer, word) == ("outer", "inner")
    assert torch.equal(zeros, torch.zeros(2)) and torch.equal(ones, torch.ones(1))


class _Text(str):
    """A str of a class of its own: pickled by the full pickler, by reference to its class."""


def test_a_plain_reply_is_plain_pickle_signed_like_every_message(cluster):
    pickler = internal._internal_rpc_pickler
    key = signing.KEY.key
    assert key is not None  # the cluster's members sign
    for value in (None, True, 7, 2**70, 0.5, "héllo", b"\x00bytes"):
        payload, tensors = pickler.serialize(value)
        body = pickle.dumps(value, protocol=5)
        assert payload == signing.SIGNED + signing.mac(body) + body and tensors == []
        assert pickler.deserialize(payload, []) == value
        forged = payload[:-1] + bytes([payload[-1] ^ 1])
        with pytest.raises(pickle.UnpicklingError, match="not signed with this cluster's key"):
            pickler.deserialize(forged, [])
    payload, _ = pickler.serialize(_Text("kept"))
    assert type(pickler.deserialize(payload, [])) is _Text


def test_a_function_found_importable_goes_by_its_patch_point_once_one_holds_it(cluster):
    """A function pickled by reference before it stood at one of torch's patch points goes
    by that point's name afterwards, as every stand-in does."""
    import colorsys

    pickler = internal._internal_rpc_pickler
    pickler.serialize(internal.PythonUDF(colorsys.rgb_to_hsv, (0, 0, 0), {}))
    assert colorsys.rgb_to_hsv in cloudpickling.importable
    colorsys.point, owner = None, colorsys
    torch_compat.patch(((owner, "point"),), colorsys.rgb_to_hsv)
    try:
        payload, _ = pickler.serialize(internal.PythonUDF(colorsys.rgb_to_hsv, (0, 0, 0), {}))
        assert b"rgb_to_hsv" not in payload and b"point" in payload
        assert colorsys.rgb_to_hsv not in cloudpickling.importable
        assert RpcPickler(io.BytesIO()).reducer_override(colorsys.rgb_to_hsv) == (getattr, (owner, "point"))
    finally:
        del colorsys.point
        torch_compat._originals.pop((owner, "point"))
        torch_compat._at_points.pop(id(colorsys.rgb_to_hsv))


def test_the_usual_call_is_pickled_all_in_c_and_the_rest_as_before(shell, monkeypatch):
    """A call of a function the receiver holds, with plain arguments, tensors, and
    containers of them, positional or keyword, asks no Python reducer, nor does one that
    uses such functions; one that uses a class or a closure, a tensor of a subclass, or
    more values than the C path looks through, takes the kept pickler. Each arrives and runs."""
    run(shell, """
def double(x):
    return 2 * x

def quadruple(x):
    return double(double(x))

def adder(y):
    def add(x):
        return x + y
    return add

add_one = adder(1)

def incremented(x):
    return add_one(double(x))

class Box:
    def __init__(self, x):
        self.x = x

def unboxed(x):
    return Box(x).x

def factorial(n):
    return 1 if n < 2 else n * factorial(n - 1)
""")
    asked = []
    reducer = RpcPickler.reducer_override
    monkeypatch.setattr(RpcPickler, "reducer_override", lambda self, obj: asked.append(obj) or reducer(self, obj))
    calls = {  # the call, what it returns, whether the kept pickler pickles it
        'rpc.rpc_sync("worker1", double, args=(3,))': (6, False),
        'rpc.rpc_sync("worker1", double, args=("ab",))': ("abab", False),
        'rpc.rpc_async("worker1", double, args=(2.5,)).wait()': (5.0, False),
        'rpc.remote("worker1", double, args=(4,)).to_here()': (8, False),
        'rpc.rpc_sync("worker1", quadruple, args=(3,))': (12, False),
        'rpc.rpc_sync("worker1", incremented, args=(3,))': (7, True),
        'rpc.rpc_sync("worker1", unboxed, args=(3,))': (3, True),
        'rpc.rpc_sync("worker1", double, args=([1],))': ([1, 1], False),
        'rpc.rpc_sync("worker1", double, args=(torch.ones(1),)).item()': (2.0, False),
        'rpc.remote("worker1", double, args=(torch.ones(1),)).to_here().item()': (2.0, False),
        'rpc.rpc_sync("worker1", double, kwargs={"x": 1})': (2, False),
        'rpc.rpc_sync("worker1", double, args=(list(range(63)),))[-1]': (62, False),  # WALK_LIMIT values
        'rpc.rpc_sync("worker1", double, args=(list(range(64)),))[-1]': (63, True),  # one past it
        'rpc.rpc_sync("worker1", double, args=(list(range(100)),))[-1]': (99, True),
        'rpc.rpc_sync("worker1", double, args=(torch.nn.Parameter(torch.ones(1)),)).item()': (2.0, True),
    }
    for call, (value, kept) in calls.items():
        run(shell, call)  # the first sends the code: the receiver then holds it
        asked.clear()
        assert run(shell, call) == value, call
        assert bool(asked) == kept, f"{call}: the kept pickler was asked about {asked}"
    reduced = []
    reduce_function = definitions.reduce_function
    monkeypatch.setattr(definitions, "reduce_function", lambda f: reduced.append(f.__name__) or reduce_function(f))
    assert run(shell, 'rpc.rpc_sync("worker1", incremented, args=(1,))') == 3
    assert sorted(reduced) == ["add", "double", "incremented"], "a function reduced twice for one message"
    run(shell, 'rpc.rpc_sync("worker1", factorial, args=(3,))')  # sent in full: held from now on
    reduced.clear()
    assert run(shell, 'rpc.rpc_sync("worker1", factorial, args=(4,))') == 24
    assert reduced == ["factorial"], "a recursive function reduced twice for one message"
    with nbrpc.trace() as recorded:  # a recorded call's trace is plain values too
        asked.clear()
        assert run(shell, 'rpc.rpc_sync("worker1", double, args=(5,))') == 10 and not asked
    [call] = recorded.snapshot()["calls"]
    assert call["request"]["pickle"] > 0 and call["reply"]["pickle"] > 0


def test_plain_arguments_pickled_all_in_c_arrive_as_they_were_sent(shell, monkeypatch):
    """The C path changes how a call is pickled, never what arrives: every plain argument
    reaches the function with its own type and value (a bool stays a bool, -0.0 keeps its
    sign, a big int its digits), the same object twice arrives equal twice, and a second
    message pickles afresh (no memo left over from the first)."""
    run(shell, "def arrived(*args):\n    return [(type(a).__name__, repr(a)) for a in args]")
    text = "ünïcode " * 2000
    sent = (3, -0.0, float("inf"), 2**70, -(2**63), True, False, None, "", text, text, b"", b"\x00\xff" * 100, 1e-308)
    asked = []
    reducer = RpcPickler.reducer_override
    monkeypatch.setattr(RpcPickler, "reducer_override", lambda self, obj: asked.append(obj) or reducer(self, obj))
    shell.user_ns["sent"] = sent
    run(shell, 'rpc.rpc_sync("worker1", arrived, args=(1,))')  # sends the code: held from now on
    for _ in range(2):
        asked.clear()
        got = run(shell, 'rpc.rpc_sync("worker1", arrived, args=sent)')
        assert not asked, f"the call took the kept pickler for {asked}"
        assert got == [(type(a).__name__, repr(a)) for a in sent]
    assert run(shell, 'rpc.rpc_sync("worker1", arrived, args=(float("nan"),))') == [("float", "nan")]


def test_a_call_pickled_all_in_c_is_signed_and_checked(shell):
    run(shell, "def triple(x):\n    return 3 * x")
    assert run(shell, 'rpc.rpc_sync("worker1", triple, args=(2,))') == 6
    udf = internal.PythonUDF(interrupts.Stoppable((shell.user_ns["triple"], "1-1", None)), (2,), {})
    receivers.begin("worker1")
    try:
        (payload, tensors), made = c_pickling.call_message(udf, None)  # (no tensors: no table asked for)
        assert tensors == [] and made is None
    finally:
        receivers.end()
    body = payload[len(signing.SIGNED) + signing.MAC_SIZE:]
    assert payload == signing.SIGNED + signing.mac(body) + body
    forged = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(pickle.UnpicklingError, match="not signed with this cluster's key"):
        internal._internal_rpc_pickler.deserialize(forged, [])


def test_nbrpcs_own_globals_go_as_extension_codes_and_a_taken_code_is_refused(shell):
    """The usual call names torch's call, its carrier and its function by pickle's
    extension codes, which the receiver finds without an import; a process where another
    library took one of the codes refuses to start serving, naming the code and the fix."""
    import pickletools
    import subprocess
    import sys

    from nbrpc.wire import serialization

    run(shell, "def quadruple(x):\n    return 4 * x")
    for _ in ("in full", "by identity, its codes found on the worker"):
        assert run(shell, 'rpc.rpc_sync("worker1", quadruple, args=(2,))') == 8
    udf = internal.PythonUDF(interrupts.Stoppable((shell.user_ns["quadruple"], "1-2", None)), (2,), {})
    receivers.begin("worker1")
    try:
        (payload, _), _ = c_pickling.call_message(udf, None)
    finally:
        receivers.end()
    codes = [arg for op, arg, _ in pickletools.genops(payload[signing.HEADER_SIZE:]) if op.name.startswith("EXT")]
    assert codes == [serialization.EXTENSIONS[("torch.distributed.rpc.internal", "PythonUDF")],
                     serialization.EXTENSIONS[("nbrpc.calls.interrupts", "Stoppable")],
                     serialization.EXTENSIONS[("nbrpc.wire.definitions", "_pinned_function")]]
    assert b"torch" not in payload and b"nbrpc." not in payload  # (no name left to import)
    taken = ("import copyreg\ncopyreg.add_extension('otherlib', 'thing', 0x6E64)\n"
             "from nbrpc.wire import serialization\nserialization.install()")
    done = subprocess.run([sys.executable, "-c", taken], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "extension code 0x6e64" in done.stderr and "copyreg.remove_extension" in done.stderr, done.stderr


def _echo(*args, **kwargs):
    return args, kwargs


def test_tensors_and_containers_pickled_in_c_go_as_the_kept_pickler_sends_them(cluster, monkeypatch):
    """The C path for tensors is the kept pickler's, bytes and tensors alike: each tensor in
    torch's tensor table, the views of one storage sent as views of it, keyword arguments
    and dicts of tensors as they are."""
    pickler = internal._internal_rpc_pickler
    pickler.serialize(internal.PythonUDF(_echo, (), {}))  # found importable
    base = torch.arange(8.0)
    grad = torch.ones(2, requires_grad=True)
    calls = [((torch.ones(4),), {}), (({"weight": base, "bias": base[2:5]},), {}), ((), {"value": base[::2]}),
             ((grad, [1, "two", (3.0, None)], base), {"again": base})]
    was = shared_tensors.is_enabled()
    shared_tensors.enable(False)  # torch's tensor table (test_shared_tensors has the shared memory one)
    try:
        for args, kwargs in calls:
            udf = internal.PythonUDF(interrupts.Stoppable((_echo, "1-1", None)), args, kwargs)
            in_c = pickler.serialize(udf)
            monkeypatch.setattr(c_pickling, "WALK_LIMIT", 0)  # the kept pickler for all
            kept = pickler.serialize(udf)
            monkeypatch.undo()
            assert in_c[0] == kept[0] and len(in_c[1]) == len(kept[1]), (args, kwargs)
            assert all(a is b for a, b in zip(in_c[1], kept[1]))
            got = pickler.deserialize(*in_c)
            assert got.func[0] is _echo and len(got.args) == len(args) and got.kwargs.keys() == kwargs.keys()
        weight, bias = pickler.deserialize(*pickler.serialize(calls[1][0]))[0].values()
        assert bias.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        assert torch.equal(bias, base[2:5]) and bias.storage_offset() == 2
    finally:
        shared_tensors.enable(was)


def test_an_rref_and_a_tensor_through_a_proxy_pickled_in_c(shell, monkeypatch):
    """A call through an RRef's proxy, with a tensor: the RRef and the tensor in C, both
    arrive (the RRef the owner's value) and the RRef is forked as torch forks it."""
    run(shell, """
class Scaler:
    def __init__(self, factor):
        self.factor = factor
    def scale(self, t, by=1):
        return t * self.factor * by
""")
    run(shell, 'scaler = rpc.remote("worker1", Scaler, args=(2.0,))')
    run(shell, 'scaler.rpc_sync().scale(torch.ones(2))')  # the proxy's helper found importable
    asked = []
    reducer = RpcPickler.reducer_override
    monkeypatch.setattr(RpcPickler, "reducer_override", lambda self, obj: asked.append(obj) or reducer(self, obj))
    got = run(shell, 'scaler.rpc_sync().scale(torch.ones(2), by=torch.tensor(3.0))')
    assert torch.equal(got, torch.full((2,), 6.0)) and not asked, asked
    assert torch.equal(run(shell, 'scaler.rpc_async().scale(torch.ones(1)).wait()'), torch.full((1,), 2.0))
    run(shell, "del scaler")
