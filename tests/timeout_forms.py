"""Every form of an RPC that times out, timed the same way under raw torch and nbrpc.

``measure()`` runs each form of ``FORMS`` (a call to ``worker1`` whose function sits in
one ``time.sleep``, or spins in Python) and returns, per form, the error's class, its
text and the seconds until it was raised. ``test_timeouts`` runs it in a notebook's
cluster; ``python timeout_forms.py PORT`` runs it in three plain processes under raw
torch (``init_rpc``, as a script does, on uv as nbrpc: shm's pollers spin a core per
process) and prints the same facts as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed.rpc as rpc

TIMEOUT = 0.3  # seconds: every form's timeout
SLEEP = 1.0  # how long the called function runs (past every timeout and its tolerance)


def sleep_in_c(seconds: float) -> float:
    time.sleep(seconds)  # one long C call: a stop lands only when it returns
    return seconds


def spin(seconds: float) -> float:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


def echo(value):
    return value


class SlowToUnpickle:
    """An argument whose unpickling takes ``seconds``, on the callee: a call carrying it
    has not begun there when a shorter timeout of its caller fires (torch's
    ``SlowPickleClass`` of ``test_all_gather_timeout``)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __setstate__(self, state: dict) -> None:
        time.sleep(state["seconds"])
        self.__dict__.update(state)


NOTED: list[str] = []  # on the callee: what ``note`` was given


def note(text: str, _slow=None) -> int:
    NOTED.append(text)
    return len(NOTED)


def noted() -> list[str]:
    return NOTED


def _value(fut):
    return fut.wait()


def _with_default_timeout(call):
    """``call()`` with the agent's default timeout set to ``TIMEOUT`` (what ``init_rpc``'s
    ``rpc_timeout`` and ``%rpc_init --timeout`` set), then back."""
    before = rpc.get_rpc_timeout()
    rpc._set_rpc_timeout(TIMEOUT)
    try:
        return call()
    finally:
        rpc._set_rpc_timeout(before)


FORMS = {
    "rpc_sync": lambda: rpc.rpc_sync("worker1", sleep_in_c, args=(SLEEP,), timeout=TIMEOUT),
    "rpc_sync, a Python loop": lambda: rpc.rpc_sync("worker1", spin, args=(SLEEP,), timeout=TIMEOUT),
    "rpc_async().wait()": lambda: rpc.rpc_async("worker1", sleep_in_c, args=(SLEEP,), timeout=TIMEOUT).wait(),
    "then": lambda: rpc.rpc_async("worker1", sleep_in_c, args=(SLEEP,), timeout=TIMEOUT).then(_value).wait(),
    "remote().to_here(timeout)": lambda: rpc.remote("worker1", sleep_in_c, args=(SLEEP,)).to_here(TIMEOUT),
    "rpc_sync, default timeout": lambda: _with_default_timeout(
        lambda: rpc.rpc_sync("worker1", sleep_in_c, args=(SLEEP,))),
    "rpc_async, default timeout": lambda: _with_default_timeout(
        lambda: rpc.rpc_async("worker1", sleep_in_c, args=(SLEEP,)).wait()),
}


def measure(tries: int = 2) -> dict:
    """Per form: the error's class and text, and the shortest of ``tries`` times to it;
    after each, whether worker1's next call answered right."""
    facts = {}
    for form, call in FORMS.items():
        took = []
        for _ in range(tries):
            began = time.monotonic()
            try:
                call()
            except Exception as e:  # the timeout, whatever its class
                took.append(time.monotonic() - began)
                error = e
            else:
                raise AssertionError(f"{form}: no timeout")
            next_call = rpc.rpc_sync("worker1", echo, args=(form,), timeout=10) == form
        facts[form] = {"class": type(error).__name__, "runtime_error": isinstance(error, RuntimeError),
                       "text": str(error), "seconds": min(took), "next_call": next_call}
    return facts


def _member(rank: int, port: int) -> None:
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60,
                                              init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"])
    rpc.init_rpc(["master", "worker1", "worker2"][rank], rank=rank, world_size=3, rpc_backend_options=options)
    if rank == 0:
        facts = measure()
        print(json.dumps(facts), flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    # torch's workers import this module by name, as a script's workers import its functions.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch.multiprocessing as mp
    from timeout_forms import _member  # the module's own name, not __main__

    mp.spawn(_member, args=(int(sys.argv[1]),), nprocs=3)
