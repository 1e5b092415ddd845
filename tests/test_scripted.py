"""A TorchScript function whose cell runs again (``nbrpc/calls/scripted.py``): torch compiles
it under a mangled name (``__torch__.___torch_mangle_N.f``) that the members lack, or hold
for another version; called over RPC, the newest definition runs, through ``rpc_sync``,
``rpc_async`` and ``remote``, whether the members ran the cell again or not."""

from __future__ import annotations

import pytest
import torch
from conftest import run

PRELUDE = "import torch\nimport torch.distributed.rpc as rpc\nfrom torch import Tensor\n"


def definition(body: str) -> str:
    return PRELUDE + f"""
@torch.jit.script
def rerun_f(x: Tensor, k: int = 2) -> Tensor:
    return {body}

@rpc.functions.async_execution
@torch.jit.script
def rerun_later(x: Tensor) -> torch.futures.Future[Tensor]:
    fut = torch.jit.fork(rerun_f, x)
    return fut
"""


CALLS = """[rpc.rpc_sync("worker1", rerun_f, args=(torch.ones(2),)).tolist(),
 rpc.rpc_async("worker2", rerun_f, args=(torch.ones(2),), kwargs={"k": 3}).wait().tolist(),
 rpc.remote("worker1", rerun_f, args=(torch.ones(2),)).to_here().tolist(),
 rpc.rpc_sync("worker2", rerun_later, args=(torch.ones(2),)).tolist()]"""


def called(shell) -> list:
    return run(shell, CALLS)


def test_a_changed_script_function_run_again_runs_its_new_body_on_the_members(shell, cluster):
    first = definition("x * k")
    cluster.run(first, targets="all")  # on every member, as torch's docs say ("on both workers")
    run(shell, first)
    assert run(shell, "rerun_f.qualified_name") == "__torch__.rerun_f"  # torch's own path
    assert called(shell) == [[2.0, 2.0], [3.0, 3.0], [2.0, 2.0], [2.0, 2.0]]

    run(shell, definition("x * k + 10"))  # the cell run again in the notebook only
    assert "___torch_mangle_" in run(shell, "rerun_f.qualified_name")
    assert called(shell) == [[12.0, 12.0], [13.0, 13.0], [12.0, 12.0], [12.0, 12.0]]

    third = definition("x * k + 100")
    cluster.run(third, targets="all")  # run again everywhere: each member's own count
    run(shell, third)
    assert called(shell) == [[102.0, 102.0], [103.0, 103.0], [102.0, 102.0], [102.0, 102.0]]

    run(shell, definition("x * k + 10"))  # back to the second body: compiled before
    assert called(shell) == [[12.0, 12.0], [13.0, 13.0], [12.0, 12.0], [12.0, 12.0]]


def test_a_members_own_function_of_the_name_runs_as_under_torch(shell, cluster):
    """A name compiled once goes as torch sends it: the callee runs its own definition."""
    cluster.run(PRELUDE + "@torch.jit.script\ndef own_body(x: Tensor) -> Tensor:\n    return x - 1\n",
                targets="all")
    run(shell, PRELUDE + "@torch.jit.script\ndef own_body(x: Tensor) -> Tensor:\n    return x + 1\n")
    assert run(shell, 'rpc.rpc_sync("worker1", own_body, args=(torch.zeros(1),)).item()') == -1.0
    assert torch.equal(run(shell, "own_body(torch.zeros(1))"), torch.ones(1))



def test_a_member_that_lacks_a_name_it_uses_says_so(shell, cluster):
    """Compiled on a member from its source, a function finds the names it uses there, as
    a script's import would: a helper only the notebook has is named in the error."""
    helper = PRELUDE + "@torch.jit.script\ndef only_here(x: Tensor) -> Tensor:\n    return x * 5\n"
    uses = PRELUDE + "@torch.jit.script\ndef uses_helper(x: Tensor) -> Tensor:\n    return only_here(x)\n"
    run(shell, helper)
    run(shell, uses)
    run(shell, uses)  # compiled again: mangled
    with pytest.raises(RuntimeError, match="only_here") as info:
        run(shell, 'rpc.rpc_sync("worker1", uses_helper, args=(torch.ones(1),))')
    assert "could not be compiled on 'worker1'" in str(info.value), info.value
    assert "%%rpc_on worker1" in str(info.value), info.value
    cluster.run(helper, targets="worker1")
    assert run(shell, 'rpc.rpc_sync("worker1", uses_helper, args=(torch.ones(1),)).item()') == 5.0
