"""Make each of torch's test processes an nbrpc member, chosen by the environment.

``run.py`` sets ``NBRPC_CONFORMANCE`` (``raw``, ``nbrpc`` or ``nbrpc-trace``) and
``NBRPC_CONFORMANCE_KEY`` (hex) for the test runner; torch's ``MultiProcessTestCase``
spawns the ranks, which inherit that environment and import the generated test module
(``suites``) to find their test class, so ``apply`` runs in every rank before its test
body calls ``rpc.init_rpc``. It must run before torch's test modules are imported: some
(the RL example) take ``rpc_sync`` and friends by name, as a notebook cell importing
them after ``%rpc_init`` does.

The steps a member takes after its agent started run after each
``torch.distributed.rpc._init_rpc_backend``, which ``init_rpc`` calls last and some
tests call themselves.
"""

from __future__ import annotations

import functools
import os

from .member import become_member

MODES = {"raw": None, "nbrpc": (True, False), "nbrpc-trace": (True, True)}
ENV_MODE = "NBRPC_CONFORMANCE"
ENV_KEY = "NBRPC_CONFORMANCE_KEY"
_applied = False


def mode() -> str:
    chosen = os.environ.get(ENV_MODE, "raw")
    if chosen not in MODES:
        raise ValueError(f"{ENV_MODE}={chosen!r}: choose one of {', '.join(MODES)}")
    return chosen


def apply() -> str:
    """Install nbrpc's patches in this process if the environment asks for them (idempotent);
    returns the mode."""
    global _applied
    chosen = mode()
    if MODES[chosen] is None or _applied:
        return chosen
    import torch.distributed.rpc as rpc

    track, trace = MODES[chosen]
    joined = become_member(bytes.fromhex(os.environ[ENV_KEY]), track=track, trace=trace)
    start = rpc._init_rpc_backend

    @functools.wraps(start)
    def init_rpc_backend(*args, **kwargs):
        start(*args, **kwargs)
        if rpc.api._is_current_rpc_agent_set():  # a test's stub backend starts none
            joined()

    rpc._init_rpc_backend = init_rpc_backend
    _applied = True
    return chosen
