"""Notebook code behaves as the script it replaces: one persistent namespace per process.

Cells run in a real IPython shell (``__main__`` like a notebook's) driving a real
cluster; the last tests paste PyTorch's parameter-server example into a real kernel.
"""

from __future__ import annotations

import contextlib
import os

import nbformat
import pytest
from conftest import run
from nbclient import NotebookClient

from nbrpc.errors import SerializationError


def on_worker(cluster, name: str, expression: str):
    """The value of ``expression`` in the worker's kernel namespace (via %%rpc_on)."""
    captured = []

    class Output:
        def stream(self, worker, name_, text):
            captured.append(text)

        def display(self, worker, data, metadata):
            pass

    cluster.run(f"print(repr({expression}))", name, Output())
    return "".join(captured).strip().removeprefix(f"[{name}] ")


# -- the three cases of a script under torch RPC -------------------------------------


def test_a_global_lock_is_made_fresh_on_the_worker(shell):
    assert run(shell, """
lock = threading.Lock()
def locked_get():
    with lock:
        return 1
rpc.rpc_sync("worker1", locked_get)
""") == 1
    # the worker has its own lock, not a copy of the driver's state
    shell.user_ns["lock"].acquire()
    try:
        assert run(shell, 'rpc.rpc_sync("worker1", locked_get, timeout=5)') == 1
    finally:
        shell.user_ns["lock"].release()


def test_module_state_lives_on_in_each_process(shell, cluster):
    assert run(shell, """
state = None
def get_state():
    global state
    if state is None:
        state = [0]
    state[0] += 1
    return state[0]
rpc.rpc_sync("worker1", get_state), rpc.rpc_sync("worker1", get_state)
""") == (1, 2)
    assert shell.user_ns["state"] is None  # the driver's own stays untouched
    assert run(shell, 'rpc.rpc_sync("worker2", get_state)') == 1  # each worker its own
    assert on_worker(cluster, "worker1", "state") == "[2]"


def test_a_call_coming_back_runs_the_drivers_own_function(shell):
    assert run(shell, """
def call_back():
    return rpc.rpc_sync("master", get_state)
rpc.rpc_sync("worker1", call_back), rpc.rpc_sync("worker1", call_back), state
""") == (1, 2, [2])


# -- the namespace is the worker kernel's ---------------------------------------------


def test_rpc_on_sees_what_rpc_did_and_the_other_way_round(shell, cluster):
    run(shell, """
counter = 0
def bump(by):
    global counter
    counter += by
    return counter
""")
    assert run(shell, 'rpc.rpc_sync("worker2", bump, args=(5,))') == 5
    assert on_worker(cluster, "worker2", "counter") == "5"
    cluster.run("counter = 100", "worker2")
    assert run(shell, 'rpc.rpc_sync("worker2", bump, args=(1,))') == 101
    assert shell.user_ns["counter"] == 0


def test_a_redefined_function_reaches_the_workers(shell, cluster):
    assert run(shell, """
def version():
    return "first"
def report():
    return version()
rpc.rpc_sync("worker1", report)
""") == "first"
    assert run(shell, """
def version():
    return "second"
rpc.rpc_sync("worker1", report)
""") == "second"
    assert on_worker(cluster, "worker1", "version()") == "'second'"
    # a function the worker defined itself is its own: the driver's does not replace it
    cluster.run("def version():\n    return 'worker'", "worker2")
    assert run(shell, 'rpc.rpc_sync("worker2", report)') == "worker"


def test_classes_round_trip_and_keep_class_state_per_process(shell, cluster):
    run(shell, """
class Counter:
    made = 0
    def __init__(self, start):
        type(self).made += 1
        self.value = start
    def add(self, n):
        return Counter(self.value + n)

def make_two():
    Counter(0)
    return Counter(7), Counter.made
""")
    c, made = run(shell, 'rpc.rpc_sync("worker1", make_two)')
    assert made == 2 and c.value == 7
    assert type(c) is shell.user_ns["Counter"]  # back home: the driver's own class
    assert shell.user_ns["Counter"].made == 0  # whose class-level state is its own
    _, made = run(shell, 'rpc.rpc_sync("worker1", make_two)')
    assert made == 4  # the worker's class kept its count between calls
    moved = run(shell, 'rpc.rpc_sync("worker2", Counter.add, args=(Counter(1), 2))')
    assert type(moved) is shell.user_ns["Counter"] and moved.value == 3


def test_closures_recursion_and_lambdas_in_globals(shell):
    assert run(shell, """
def factorial(n):
    return 1 if n <= 1 else n * factorial(n - 1)
def is_even(n):
    return True if n == 0 else is_odd(n - 1)
def is_odd(n):
    return False if n == 0 else is_even(n - 1)
square = lambda x: x * x
def make_counter():
    count = 0
    def step():
        nonlocal count
        count += 1
        return count
    return step
step = make_counter()
def use_all():
    return factorial(5), is_even(10), is_odd(7), square(9), step(), step()
rpc.rpc_sync("worker2", use_all)
""") == (120, True, True, 81, 1, 2)
    # the closure bound on the worker keeps counting there, as it would in a script
    assert run(shell, 'rpc.rpc_sync("worker2", use_all)')[4:] == (3, 4)
    assert run(shell, "step()") == 1


def test_worker_definitions_go_to_the_driver_and_to_other_workers(shell, cluster):
    cluster.run("""
import os
hits = 0
def made_on_worker1():
    global hits
    hits += 1
    return os.getpid(), hits
""", "worker1")
    pids = {w.name: w.pid for w in cluster.workers}
    fn = run(shell, 'rpc.rpc_sync("worker1", lambda: __import__("__main__").made_on_worker1)')
    assert shell.user_ns["made_on_worker1"] is fn  # stored under its name here too
    assert fn() == (os.getpid(), 1)  # on the driver's globals (hits filled in as 0)
    assert run(shell, 'rpc.rpc_sync("worker2", made_on_worker1)') == (pids["worker2"], 2)
    # back on worker1 it is worker1's own function, counting on worker1's globals
    assert run(shell, 'rpc.rpc_sync("worker1", made_on_worker1)') == (pids["worker1"], 1)
    assert run(shell, 'rpc.rpc_sync("worker1", made_on_worker1)') == (pids["worker1"], 2)


def test_per_process_primitives_arrive_fresh(shell):
    got = run(shell, """
event = threading.Event(); event.set()
condition = threading.Condition()
semaphore = threading.BoundedSemaphore(3)
rlock = threading.RLock()
def primitives():
    return (type(event).__name__, event.is_set(), type(condition).__name__,
            semaphore._initial_value, rlock.acquire(blocking=False))
rpc.rpc_sync("worker1", primitives)
""")
    assert got == ("Event", False, "Condition", 3, True)


def test_an_unsendable_global_is_named_with_the_fix(shell):
    run(shell, """
import socket
listener = socket.socket()
def serve():
    return listener.fileno()
def entry():
    return serve()
""")
    with pytest.raises(SerializationError) as caught:
        run(shell, 'rpc.rpc_sync("worker1", entry)')
    message = str(caught.value)
    assert "the global 'listener' (socket) that serve uses" in message
    assert "%%rpc_on all" in message
    run(shell, "listener.close()")


def test_an_unchanged_function_is_pickled_once(shell):
    from nbrpc.wire import definitions

    run(shell, "def cached(x):\n    return x + 1")
    cached = shell.user_ns["cached"]
    for _ in range(3):
        assert run(shell, 'rpc.rpc_sync("worker1", cached, args=(1,))') == 2
    identity = definitions.REGISTRY.identities[cached]
    assert identity.version == 1
    cached.__code__ = (lambda x: x + 2).__code__
    assert run(shell, 'rpc.rpc_sync("worker1", cached, args=(1,))') == 3
    assert identity.version == 2


@contextlib.contextmanager
def _wrongly_believed_held(worker: str, key):
    """The driver believes ``worker`` holds ``key`` (a definition it was never sent)."""
    from nbrpc.wire import definitions

    definitions.receivers.acknowledged(worker, [key])
    try:
        yield
    finally:
        definitions.receivers.known[worker].discard(key)


def _sent_bytes(func, to: str, args: tuple = (1,)) -> int:
    """Bytes of an rpc_sync of ``func`` to ``to`` as nbrpc's wrapper pickles it now."""
    from torch.distributed.rpc import internal

    from nbrpc.calls import interrupts
    from nbrpc.wire.definitions import receivers

    receivers.begin(to)
    try:
        udf = internal.PythonUDF(interrupts.Stoppable((func, "1-1", None)), args, {})
        return len(internal._internal_rpc_pickler.serialize(udf)[0])
    finally:
        receivers.end()


def test_after_the_first_answer_a_call_sends_the_codes_digest(shell, cluster):
    from nbrpc.wire.definitions import receivers

    body = "\n".join(f"    x = x + {i}" for i in range(60))
    run(shell, f"def long_cell(x):\n{body}\n    return x\n"
               "def uses_it(x):\n    return long_cell(x) * SCALE\nSCALE = 2")
    func = shell.user_ns["long_cell"]
    full = _sent_bytes(func, "worker1")
    assert run(shell, 'rpc.rpc_sync("worker1", long_cell, args=(1,))') == 1 + sum(range(60))
    small = _sent_bytes(func, "worker1")
    assert small < full - 400  # the code's pickle (hundreds of bytes) became 16
    assert _sent_bytes(func, "worker2") == full  # worker2 never answered one: in full
    # a function with globals: the one it calls goes by digest too, the value is right
    assert run(shell, 'rpc.rpc_sync("worker1", uses_it, args=(1,))') == 2 * (1 + sum(range(60)))
    assert run(shell, 'rpc.rpc_async("worker1", uses_it, args=(2,)).wait()') == 2 * (2 + sum(range(60)))
    assert run(shell, 'rpc.remote("worker1", uses_it, args=(3,)).to_here()') == 2 * (3 + sum(range(60)))
    assert len(receivers.known["worker1"]) >= 2


def test_the_newest_definition_wins_by_digest_too(shell, cluster):
    for answer in ("one", "two", "one"):  # back to the first code: its digest is known
        run(shell, f"def which():\n    return {answer!r}")
        for call in ('rpc.rpc_sync("worker1", which)', 'rpc.rpc_async("worker1", which).wait()',
                     'rpc.remote("worker1", which).to_here()'):
            assert run(shell, call) == answer
        assert on_worker(cluster, "worker1", "which()") == repr(answer)


def test_a_forked_worker_sends_its_code_by_digest_too(cluster):
    """Workers forked from the warm template keep one ``receivers`` for the calls layer
    and the pickler: worker1's second call to worker2 goes by digest."""
    cluster.run("""
import torch.distributed.rpc as rpc
from nbrpc.wire.definitions import receivers
def doubled(x):
    return 2 * x
answers = [rpc.rpc_sync("worker2", doubled, args=(i,)) for i in range(3)]
""", "worker1")
    assert on_worker(cluster, "worker1", "answers") == "[0, 2, 4]"
    # its code's digest and its identity (a top-level function)
    assert on_worker(cluster, "worker1", "len(receivers.known.get('worker2', ()))") == "2"


def test_calls_in_flight_before_the_first_answer_carry_the_code(shell):
    """Calls sent at once may be handled in any order: none may rely on another."""
    run(shell, "def in_flight(x):\n    return x * 3")
    assert run(shell, """
futs = [rpc.rpc_async(w, in_flight, args=(i,)) for i in range(40) for w in ("worker1", "worker2")]
[f.wait() for f in futs]
""") == [i * 3 for i in range(40) for _ in range(2)]


def test_a_function_gone_on_the_receiver_is_rebuilt_from_its_digest(shell):
    """Lambdas made per call share one code: later ones go by digest, and each is
    built from the code the worker keeps (the earlier lambda was collected there)."""
    assert run(shell, """
[rpc.rpc_sync("worker1", lambda: (lambda v: v + k)(0)) for k in range(5)]
""") == [0, 1, 2, 3, 4]
    assert run(shell, """
[rpc.rpc_sync("worker1", lambda: 7) for _ in range(5)]
""") == [7] * 5


def test_a_top_level_function_goes_by_identity_with_the_definitions_it_uses(shell, cluster):
    """Once worker1 answered, a top-level function goes as its identity plus the notebook
    definitions among its globals: a newer one of those still replaces the old there."""
    run(shell, "import math\nRATE = 3\ndef part(x):\n    return x + 1\n"
               "def whole(x):\n    return math.floor(part(x) * RATE)")
    whole = shell.user_ns["whole"]
    full = _sent_bytes(whole, "worker1")
    assert run(shell, 'rpc.rpc_sync("worker1", whole, args=(1,))') == 6
    assert _sent_bytes(whole, "worker1") < full // 2  # its code, the constant and the module stay home
    run(shell, "def part(x):\n    return x + 2")  # a cell run again: a new definition
    assert run(shell, 'rpc.rpc_sync("worker1", whole, args=(1,))') == 9
    assert on_worker(cluster, "worker1", "part(0)") == "2"
    assert run(shell, 'rpc.rpc_async("worker1", whole, args=(2,)).wait()') == 12
    assert run(shell, 'rpc.remote("worker1", whole, args=(3,)).to_here()') == 15


def test_a_held_function_is_told_once_until_its_name_or_code_changes(shell, cluster):
    """A top-level function without globals its receiver holds goes by identity from the
    receivers' table (``Receivers.held``), not asked again per call: a cell run again, a
    code replaced in place and a holding forgotten each send the function anew."""
    from nbrpc.wire.definitions import receivers

    def held_there(func, to="worker1"):
        receivers.begin(to)
        try:
            return receivers.held(func) is not None
        finally:
            receivers.end()

    run(shell, "def held_once(x):\n    return x + 1")
    first = shell.user_ns["held_once"]
    for _ in range(3):  # in full, then by identity (remembered), then from the table
        assert run(shell, 'rpc.rpc_sync("worker1", held_once, args=(1,))') == 2
    assert held_there(first) and not held_there(first, "worker2")
    run(shell, "def held_once(x):\n    return x + 2")  # the cell run again
    assert not held_there(first)  # no longer stored under its name
    assert run(shell, 'rpc.rpc_sync("worker1", held_once, args=(1,))') == 3
    second = shell.user_ns["held_once"]
    run(shell, 'rpc.rpc_sync("worker1", held_once, args=(1,))')
    assert held_there(second)
    second.__code__ = (lambda x: x + 3).__code__
    assert not held_there(second)
    assert run(shell, 'rpc.rpc_sync("worker1", held_once, args=(1,))') == 4
    run(shell, 'rpc.rpc_sync("worker1", held_once, args=(1,))')
    assert held_there(second)
    believed = set(receivers.known["worker1"])
    receivers.known["worker1"].clear()  # what worker1 holds, forgotten
    try:
        assert not held_there(second)
    finally:
        receivers.known["worker1"].update(believed)


def test_an_identity_the_receiver_never_got_is_a_clear_error(shell):
    from nbrpc.wire import definitions

    run(shell, "def never_pinned(x):\n    return x")
    func = shell.user_ns["never_pinned"]
    ident = definitions._identity(func)
    definitions._cache_code(ident, func)
    key = (ident.origin, ident.token, ident.version)
    with _wrongly_believed_held("worker2", key), \
            pytest.raises(RuntimeError, match="a notebook function .* was never sent to this process"):
        run(shell, 'rpc.rpc_sync("worker2", never_pinned, args=(1,))')
    assert run(shell, 'rpc.rpc_sync("worker2", never_pinned, args=(1,))') == 1


def test_a_class_the_receiver_holds_goes_by_identity(shell, cluster):
    """Once worker1 answered a call that carried a top-level class in full, an instance
    goes with its class's identity only: the same class arrives there, with the
    class-level state it has there; a class redefined goes in full again."""
    run(shell, "class Marker:\n    seen = 0\n    def __init__(self, x):\n        self.x = x\n"
               "    def twice(self):\n        return 2 * self.x\n"
               "def count_in(m):\n    type(m).seen += 1\n    return type(m).seen, id(type(m)), m.twice()")
    count_in, marker = shell.user_ns["count_in"], shell.user_ns["Marker"](3)
    full = _sent_bytes(count_in, "worker1", (marker,))
    first = run(shell, 'rpc.rpc_sync("worker1", count_in, args=(Marker(3),))')
    # the instance's own state and a reference to its class; its methods, dict and skeleton stay home
    assert _sent_bytes(count_in, "worker1", (marker,)) < _sent_bytes(count_in, "worker1") + 100 < full // 4
    assert _sent_bytes(count_in, "worker2", (marker,)) == full  # worker2 never answered one
    second = run(shell, 'rpc.rpc_sync("worker1", count_in, args=(Marker(4),))')
    assert (first[0], second[0]) == (1, 2) and first[1] == second[1] and second[2] == 8  # one class there
    assert shell.user_ns["Marker"].seen == 0
    assert run(shell, 'rpc.remote("worker1", count_in, args=(Marker(5),)).to_here()')[:3:2] == (3, 10)
    run(shell, "class Marker:\n    seen = 10\n    def __init__(self, x):\n        self.x = x\n"
               "    def twice(self):\n        return 3 * self.x")
    third = run(shell, 'rpc.rpc_sync("worker1", count_in, args=(Marker(3),))')
    assert third[0] == 11 and third[1] != first[1] and third[2] == 9  # the newest definition


def _traced(shell, code: str, name: str):
    """``code``'s value and the pickle bytes of the reply (as the callee's wire layer wrote
    it) of the one traced call of function ``name`` it made."""
    import nbrpc

    with nbrpc.trace() as t:
        value = run(shell, code)
    replies = [c["reply"]["pickle"] for c in t.snapshot()["calls"] if c["name"].endswith(name)]
    assert len(replies) == 1, t.snapshot()["calls"]
    return value, replies[0]


_TWO_FIELDS = ("class {name}:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n"
               "    def total(self):\n        return self.x + self.y\n"
               "    def __repr__(self):\n        return f'{name}({{self.x}}, {{self.y}})'\n")


def test_a_reply_takes_a_class_its_caller_made_home_by_identity(shell, cluster):
    """An instance of a top-level class the caller made comes back as an instance of the
    caller's own class object, the class by identity (no skeleton, dict or methods), by
    rpc_sync, rpc_async and an RRef proxy; a class the caller never made comes in full."""
    run(shell, _TWO_FIELDS.format(name="Homing") + "def bounce(p):\n    return p\n"
               "class Holder:\n    def give(self, p):\n        return p\n")
    cls = shell.user_ns["Homing"]
    run(shell, 'rpc.rpc_sync("worker1", bounce, args=(Homing(0, 0),))')  # worker1 holds it now
    forms = {"rpc_sync": 'rpc.rpc_sync("worker1", bounce, args=(Homing(1, 2),))',
             "rpc_async": 'rpc.rpc_async("worker1", bounce, args=(Homing(1, 2),)).wait()',
             "proxy": 'rpc.remote("worker1", Holder).rpc_sync().give(Homing(1, 2))'}
    sizes = {}
    for form, code in forms.items():
        value, sizes[form] = _traced(shell, code, "give" if form == "proxy" else "bounce")
        assert type(value) is cls and (value.x, value.y, value.total()) == (1, 2, 3), form
    cluster.run(_TWO_FIELDS.format(name="Away") + "away = Away(1, 2)\n", "worker1")
    away, full = _traced(shell, 'rpc.rpc_sync("worker1", lambda: __import__("__main__").away)', "<lambda>")
    assert type(away).__name__ == "Away" and away.total() == 3 and shell.user_ns["Away"] is type(away)
    assert full > 1000 and all(size < full // 4 for size in sizes.values()), (sizes, full)
    # what goes home by identity is the caller's class as it is: its class-level state its own
    cls.note = "home"
    assert run(shell, 'rpc.rpc_sync("worker1", bounce, args=(Homing(5, 6),)).note') == "home"


def test_a_class_redefined_in_a_cell_run_again_comes_home_as_the_newest(shell, cluster):
    """A class redefined comes back as the newest definition, by identity; an instance of
    the first, kept on the worker, as the first class object (the caller's own, still)."""
    run(shell, _TWO_FIELDS.format(name="Redone") + "def keep(p):\n    global kept\n    kept = p\n    return p\n"
               "def get_kept():\n    return kept\n")
    first = shell.user_ns["Redone"]
    assert type(run(shell, 'rpc.rpc_sync("worker1", keep, args=(Redone(1, 2),))')) is first
    run(shell, _TWO_FIELDS.format(name="Redone").replace("self.x + self.y", "10 * (self.x + self.y)"))
    newest = shell.user_ns["Redone"]
    for x, total in ((1, 30), (3, 70)):
        value, size = _traced(shell, f'rpc.rpc_sync("worker1", bounce, args=(Redone({x}, {x + 1}),))', "bounce")
        assert type(value) is newest and value.total() == total and size < 400, size
    old = run(shell, 'rpc.rpc_sync("worker1", get_kept)')
    assert type(old) is first and old.total() == 3


def test_a_class_identity_the_receiver_never_got_is_a_clear_error(shell):
    from nbrpc.wire import definitions

    run(shell, "class NeverPinned:\n    pass\ndef kind_of(x):\n    return type(x).__name__")
    cls = shell.user_ns["NeverPinned"]
    ident = definitions._identity(cls)
    key = (ident.origin, ident.token, 0)
    with _wrongly_believed_held("worker2", key), \
            pytest.raises(RuntimeError, match="a notebook class .* was never sent to this process"):
        run(shell, 'rpc.rpc_sync("worker2", kind_of, args=(NeverPinned(),))')
    assert run(shell, 'rpc.rpc_sync("worker2", kind_of, args=(NeverPinned(),))') == "NeverPinned"


def test_a_digest_the_receiver_never_got_is_a_clear_error(shell):
    from nbrpc.wire import definitions

    run(shell, "def never_sent(x):\n    return x")
    func = shell.user_ns["never_sent"]
    ident = definitions._identity(func)
    definitions._cache_code(ident, func)
    with _wrongly_believed_held("worker2", ident.digest), \
            pytest.raises(RuntimeError, match="the code of never_sent .* was never sent to this process"):
        run(shell, 'rpc.rpc_sync("worker2", never_sent, args=(1,))')
    assert run(shell, 'rpc.rpc_sync("worker2", never_sent, args=(1,))') == 1


def test_lambdas_made_per_call_do_not_pile_up(shell):
    total = run(shell, """
total = sum(rpc.rpc_sync("worker1", lambda x: x + i, args=(1,)) for i in range(300))
total
""")
    assert total == sum(range(1, 301))
    kept = run(shell, """
def kept_definitions():
    import gc
    from nbrpc.wire import definitions
    gc.collect()
    return len(definitions.REGISTRY.received)
rpc.rpc_sync("worker1", kept_definitions)
""")
    assert kept < 50  # the top-level ones of this module, not one per lambda


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_the_issues_three_cases_in_a_kernel(tmp_path):
    sources = [
        "%load_ext nbrpc",
        "%rpc_init --names trainer_1 --driver-name parameter_server",
        """
import threading, torch.distributed.rpc as rpc

lock = threading.Lock()
def locked_get():
    with lock:
        return 1
rpc.rpc_sync("trainer_1", locked_get)""",
        """
state = None
def get_state():
    global state
    if state is None:
        state = [0]
    state[0] += 1
    return state[0]
rpc.rpc_sync("trainer_1", get_state), rpc.rpc_sync("trainer_1", get_state)""",
        """
def call_back():
    return rpc.rpc_sync("parameter_server", get_state)
rpc.rpc_sync("trainer_1", call_back), rpc.rpc_sync("trainer_1", call_back), state""",
        "%%rpc_on trainer_1\nprint(state)",
        "%rpc_shutdown",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(notebook, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()

    def result(cell):
        (data,) = [o.data for o in cell.outputs if o.output_type == "execute_result"]
        return data["text/plain"]

    assert [result(notebook.cells[i]) for i in (2, 3, 4)] == ["1", "(1, 2)", "(1, 2, [2])"]
    assert "".join(o.get("text", "") for o in notebook.cells[5].outputs) == "[trainer_1] [2]\n"
