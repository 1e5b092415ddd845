"""Where torch's RPC raises a class, nbrpc's error is an instance of it: each row of
``errors.TORCH_RAISES`` (and each failure nbrpc leaves to torch) measured in a plain
script under raw torch and on a real cluster, the same code on both sides."""

from __future__ import annotations

import json

import pytest
from conftest import free_port, run
from plain_torch import JOIN, run_ranks

import nbrpc
from nbrpc import errors

pytestmark = pytest.mark.slow

# On every member (a notebook's cells, a script's top): the failing functions.
DEFINITIONS = '''
import builtins, os, time
import torch
import torch.distributed.rpc as rpc


class NotebookError(Exception):
    pass


class TwoArguments(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)


def make_generator():
    return (i for i in range(3))


def sleeps(seconds):
    time.sleep(seconds)
    return seconds


def raises(name):
    raise getattr(builtins, name)("boom")


def raises_notebook_error():
    raise NotebookError("boom")


def raises_two_arguments():
    raise TwoArguments(1, 2)


def passes_on(to):
    return rpc.rpc_sync(to, raises_notebook_error)


def dies():
    os._exit(3)
'''

GENERATOR = "(i for i in range(2))"
# Each row of errors.TORCH_RAISES: the calls that fail so, run on the driver (master).
ROWS = {
    "an argument that cannot be pickled": [
        f"rpc.rpc_sync('worker1', len, args=({GENERATOR},))",
        f"rpc.rpc_async('worker1', len, args=({GENERATOR},)).wait()",
        f"rpc.remote('worker1', len, args=({GENERATOR},)).to_here()",
    ],
    "a reply that cannot be pickled (rpc_sync, rpc_async().wait(), remote().to_here())": [
        "rpc.rpc_sync('worker1', make_generator)",
        "rpc.rpc_async('worker1', make_generator).wait()",
        "rpc.remote('worker1', make_generator).to_here()",
    ],
    "an unknown worker name or rank": [
        "rpc.rpc_sync('worker9', len, args=((),))",
        "rpc.rpc_async('worker9', len, args=((),)).wait()",
        "rpc.remote('worker9', len, args=((),)).to_here()",
        "rpc.rpc_sync(99, len, args=((),))",
    ],
    "a call past its timeout (rpc_sync, rpc_async().wait(), to_here())": [
        "rpc.rpc_sync('worker1', sleeps, args=(1.5,), timeout=0.3)",
        "rpc.rpc_async('worker1', sleeps, args=(1.5,), timeout=0.3).wait()",
        "rpc.remote('worker1', sleeps, args=(1.5,)).to_here(timeout=0.3)",
    ],
    "a remote exception of a class torch does not re-create (one defined in the notebook; "
    "rpc_sync, rpc_async().wait())": [
        "rpc.rpc_sync('worker1', raises_notebook_error)",
        "rpc.rpc_async('worker1', raises_notebook_error).wait()",
        "rpc.rpc_sync('worker1', passes_on, args=('worker2',))",
    ],
}
# Failures nbrpc leaves as torch raises them: the same class on both sides.
TORCHS_OWN = [
    "rpc.rpc_sync('worker1', raises, args=('ValueError',))",
    "rpc.rpc_async('worker1', raises, args=('TypeError',)).wait()",
    "rpc.rpc_sync('worker1', raises, args=('KeyError',))",
    "rpc.rpc_sync('worker1', raises_two_arguments)",
    "rpc.remote('worker1', raises_notebook_error).to_here()",  # to_here re-creates it in Python
    "rpc.rpc_sync('worker1', sleeps, args=(1, 2))",
    "rpc.rpc_sync('worker1', 3)",
    "rpc.rpc_async('worker1', 3)",
]
# Last: a worker whose process ended, then a call to it.
WORKER_GONE = ["rpc.rpc_sync('worker2', dies)", "rpc.rpc_sync('worker2', len, args=((),))"]
NOT_INITIALIZED = "rpc.rpc_sync('worker1', len, args=((),))"
# init_rpc while RPC runs (a store of its own, so that only that is wrong).
SECOND_INIT = ("rpc.init_rpc('again', rank=0, world_size=1, rpc_backend_options="
               "rpc.TensorPipeRpcBackendOptions(init_method=f'tcp://127.0.0.1:{sys.argv[5]}'))")


# How each side measures a call: the names of the classes of what it raised, most
# derived first ([] if nothing); the plain script runs the same source.
OUTCOME = """
def outcome(code, namespace):
    try:
        eval(code, namespace)
    except Exception as e:
        return [cls.__name__ for cls in type(e).__mro__]
    return []
"""
exec(OUTCOME)


def plain_script() -> str:
    """Every rank's script: master measures a call before ``init_rpc``, each row, torch's
    own failures and a worker's death, prints one JSON line and writes the flag the
    workers wait for (worker2 is gone by then: no graceful shutdown waits for it)."""
    return DEFINITIONS + OUTCOME + f"""
import json, pathlib, sys
before = outcome({NOT_INITIALIZED!r}, globals())
""" + JOIN + f"""
flag = pathlib.Path(sys.argv[4])
if RANK == 0:
    found = {{"before": before}}
    found["rows"] = {{row: [outcome(code, globals()) for code in codes] for row, codes in {ROWS!r}.items()}}
    found["own"] = [outcome(code, globals()) for code in {TORCHS_OWN!r}]
    found["again"] = outcome({SECOND_INIT!r}, globals())
    found["gone"] = [outcome(code, globals()) for code in {WORKER_GONE!r}]
    print(json.dumps(found), flush=True)
    flag.touch()
else:
    while not flag.exists():
        time.sleep(0.1)
os._exit(0)
"""


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """What raw torch raised for each call of the plain script."""
    from conftest import Pids

    folder, pids = tmp_path_factory.mktemp("plain"), Pids()
    try:
        outs = run_ranks(folder, pids, plain_script(), args=(str(folder / "done"), str(free_port())),
                         exits={2: 3})  # worker2 ends in dies()
    finally:
        assert pids.end() == []
    return json.loads(outs[0].strip().splitlines()[-1])


@pytest.fixture(scope="module")
def namespace(shell, cluster):
    """The notebook's namespace, the definitions run there (they travel by value)."""
    run(shell, DEFINITIONS)
    return shell.user_ns


def raised(code: str, namespace: dict) -> Exception:
    try:
        eval(code, namespace)
    except Exception as e:
        return e
    pytest.fail(f"{code} raised nothing")


def test_before_a_cluster_starts_nbrpc_raises_torchs_class(raw):
    """torch, before ``init_rpc``: ``RuntimeError``; nbrpc's operations that need a cluster,
    before one starts: ``NoClusterError``, one."""
    torch_class, ours = errors.TORCH_RAISES["a call before RPC started, or after it stopped"]
    assert raw["before"][0] == torch_class.__name__
    assert nbrpc.current() is None
    with pytest.raises(ours) as info:
        nbrpc.waits()
    assert isinstance(info.value, torch_class) and "start one" in str(info.value)


def test_device_maps_torch_refuses_raise_torchs_class():
    """Before the module's cluster starts. torch refuses a device map that is not one-to-one
    (``ValueError``; checked where a map is read, with or without GPUs) and, without a GPU,
    any device map (``RuntimeError``)."""
    import torch
    import torch.distributed.rpc as rpc
    from torch.distributed.rpc.options import _to_device_map

    from nbrpc.group import devices

    torch_class, ours = errors.TORCH_RAISES["a device map that is not one-to-one"]
    with pytest.raises(torch_class, match="1-to-1"):
        _to_device_map({"cpu": "cpu", "meta": "cpu"})
    with pytest.raises(ours) as info:
        devices.parse_device_maps("worker1=0:1,0:2")
    assert isinstance(info.value, torch_class) and "one-to-one" in str(info.value)

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: the rest is about a machine without one")
    torch_class, ours = errors.TORCH_RAISES["a device map where torch sees no GPU"]
    with pytest.raises(torch_class):
        rpc.TensorPipeRpcBackendOptions(device_maps={"worker1": {0: 1}})
    assert nbrpc.current() is None
    for options in ({"gpus": True}, {"device_maps": {"worker1": {0: 1}}}):
        with pytest.raises(ours) as info:
            nbrpc.start(1, progress=None, **options)
        assert isinstance(info.value, torch_class) and "torch sees no GPU" in str(info.value)
    assert nbrpc.current() is None


@pytest.mark.parametrize("row", ROWS)
def test_each_row_is_raised_as_an_instance_of_torchs_class(raw, namespace, row):
    torch_class, ours = errors.TORCH_RAISES[row]
    for code, torch_raised in zip(ROWS[row], raw["rows"][row]):
        assert torch_raised and torch_raised[0] == torch_class.__name__, (code, torch_raised)
        error = raised(code, namespace)
        assert isinstance(error, ours) and isinstance(error, torch_class), (code, type(error).__mro__)


def test_a_remote_exception_keeps_its_own_class_too(namespace):
    error = raised(ROWS[next(r for r in ROWS if r.startswith("a remote exception"))][0], namespace)
    assert isinstance(error, namespace["NotebookError"]) and type(error).__name__ == "NotebookError"
    assert errors.remote_class(error) is namespace["NotebookError"]
    assert "boom" in str(error)


def test_failures_nbrpc_leaves_to_torch_have_torchs_class(raw, namespace):
    for code, torch_raised in zip(TORCHS_OWN, raw["own"]):
        error = raised(code, namespace)
        assert type(error).__name__ == torch_raised[0], (code, torch_raised, error)
        # `except RuntimeError:` catches it where it catches torch's, and only there
        assert isinstance(error, RuntimeError) is ("RuntimeError" in torch_raised), (code, torch_raised)


def test_a_second_start_raises_torchs_class(raw, namespace, cluster):
    torch_class, ours = errors.TORCH_RAISES["a second start while RPC runs"]
    assert torch_class.__name__ in raw["again"], raw["again"]
    with pytest.raises(ours) as info:
        nbrpc.start(1, progress=None)
    assert isinstance(info.value, torch_class) and "shut it down first" in str(info.value)


def test_a_call_to_a_worker_whose_process_ended_raises_torchs_class(raw, namespace, cluster):
    """Last in the module: worker2 ends."""
    torch_class, ours = errors.TORCH_RAISES["a call to a worker whose process ended"]
    for code, torch_raised in zip(WORKER_GONE, raw["gone"]):
        assert torch_raised[0] == torch_class.__name__, (code, torch_raised)
        error = raised(code, namespace)
        assert isinstance(error, torch_class), (code, type(error).__mro__)
    assert isinstance(raised(WORKER_GONE[-1], namespace), ours)


class Picky(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)
        self.total = a + b


def test_a_remote_exception_in_its_class_and_runtime_error_pickles_as_its_own_class():
    import copy
    import pickle

    error = errors.with_torch_class(Picky(1, 2))
    assert isinstance(error, Picky) and isinstance(error, RuntimeError) and type(error).__name__ == "Picky"
    assert errors.with_torch_class(Picky(3, 4)).__class__ is type(error)  # one class per class
    for back in (pickle.loads(pickle.dumps(error)), copy.copy(error)):
        assert type(back) is Picky and back.args == (1, 2) and back.total == 3
    # what cannot take a class shared with RuntimeError stays as it is
    assert type(errors.with_torch_class(KeyboardInterrupt())) is KeyboardInterrupt
    slotted = type("Slotted", (Exception,), {"__slots__": ("why",)})
    assert type(errors.with_torch_class(slotted("no"))) is slotted


def test_the_docs_table_is_the_tested_one():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "guide" / "errors.md").read_text()
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    table = {when.removeprefix("| "): torch_class.strip("`") for when, torch_class, _ in rows}
    assert table == {when: torch_class.__name__ for when, (torch_class, _) in errors.TORCH_RAISES.items()}
    for when, (_, ours) in errors.TORCH_RAISES.items():
        assert ours is errors.RemoteClassError or f"`{ours.__name__}`" in page, when
