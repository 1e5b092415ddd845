"""Every kind of callable torch's RPC tells apart (a builtin operator, a TorchScript function,
a Python function, ``@async_execution`` of either) behaves from a notebook as in a plain
script under raw torch, through ``rpc_sync``, ``rpc_async``, ``remote`` and RRef proxies,
with and without the profiler; and so do the examples of ``async_execution``'s docstring,
taken from the installed torch as they are written.

The same code runs twice: in a plain script, each of its three processes calling
``init_rpc`` (master, worker1, worker2), and in this process's IPython shell as a kernel's
``__main__`` with an nbrpc cluster, the definitions on every member; what each prints must
be the same.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch.distributed.rpc as rpc
from conftest import run
from plain_torch import JOIN, run_ranks
from rpc_profiling import release_profiling_key

pytestmark = pytest.mark.slow

PRELUDE = "import torch\nimport torch.distributed.rpc as rpc\n"

# Definitions on every member: one callable of each kind, and a class whose RRef's
# proxies call a plain method, an @async_execution one and a TorchScript module's forward.
KIND_DEFINITIONS = '''
from torch import Tensor
from torch.futures import Future


@torch.jit.script
def kind_script_mul(x: Tensor, y: Tensor) -> Tensor:
    return x * y


@rpc.functions.async_execution
@torch.jit.script
def kind_async_script(to: str, x: Tensor, y: Tensor) -> Future[Tensor]:
    return rpc.rpc_async(to, kind_script_mul, (x, y))


def kind_python(x, y):
    return x - y


@rpc.functions.async_execution
def kind_async_python(to, x, y):
    return rpc.rpc_async(to, torch.mul, args=(x, y)).then(lambda fut: fut.wait() + 1)


class KindHolder:
    def plain(self, x):
        return x * 3

    @staticmethod
    @rpc.functions.async_execution
    def later(to, x):
        return rpc.rpc_async(to, torch.add, args=(x, 5))


def kind_scripted_module():
    return torch.jit.script(torch.nn.ReLU())
'''

# On the driver: each kind through each call form, plain and profiled; one line each.
KIND_CALLS = '''
x, y = torch.arange(4.0), torch.full((4,), 2.0)
kinds = {
    "builtin": (torch.add, (x, y)),
    "ScriptFunction": (kind_script_mul, (x, y)),
    "Python function": (kind_python, (x, y)),
    "async_execution of a Python function": (kind_async_python, ("worker2", x, y)),
    "async_execution of a ScriptFunction": (kind_async_script, ("worker2", x, y)),
}
forms = {
    "rpc_sync": lambda f, a: rpc.rpc_sync("worker1", f, args=a),
    "rpc_async": lambda f, a: rpc.rpc_async("worker1", f, args=a).wait(),
    "remote": lambda f, a: rpc.remote("worker1", f, args=a).to_here(),
}
holder = rpc.remote("worker1", KindHolder)
module = rpc.remote("worker1", kind_scripted_module)
proxies = {
    "rpc_sync().plain": lambda: holder.rpc_sync().plain(x),
    "rpc_async().later": lambda: holder.rpc_async().later("worker2", x).wait(),
    "remote().later": lambda: holder.remote().later("worker2", x).to_here(),
    "ScriptModule rpc_sync().forward": lambda: module.rpc_sync().forward(x - 1),
}
for profiled in (False, True):
    for label, call in [*((f"{form} {kind}", (lambda c=c, f=f, a=a: c(f, a)))
                          for kind, (f, a) in kinds.items() for form, c in forms.items()),
                        *proxies.items()]:
        with (torch.autograd.profiler.profile() if profiled else contextlib.nullcontext()):
            try:
                got = repr(call())
            except Exception as e:
                got = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        print(f"{'profiled ' if profiled else ''}{label} -> {got}")
# torch leaves its RPC profiling key set on this thread after a ScriptFunction's call under the
# default (Kineto) profiler: a call under the legacy profiler, the one that records RPCs, fails
try:
    with torch.autograd.profiler_legacy.profile():
        rpc.rpc_sync("worker1", torch.add, args=(x, y))
    print("legacy profiler after them -> ok")
except RuntimeError as e:
    print(f"legacy profiler after them -> RuntimeError: {e}")
'''


def docstring_examples() -> list[tuple[str, str]]:
    """``async_execution``'s examples as (what runs on all workers, what runs on worker0);
    the last one reuses the class of the one before."""
    blocks, lines = [], []
    for line in (rpc.functions.async_execution.__doc__ + "\n").splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>"):
            lines.append(stripped[4:])
        elif lines:
            blocks.append("\n".join(lines))
            lines = []
    examples = []
    for block in blocks:
        shared, marker, main = block.partition("# On worker0")
        examples.append((shared, marker + main) if marker else ("", block))
    return examples


def definitions() -> str:
    return PRELUDE + "import contextlib\n" + KIND_DEFINITIONS + "".join(
        f"\n{shared}\n" for shared, _ in docstring_examples())


def driver_parts() -> list[str]:
    return [KIND_CALLS] + [main for _, main in docstring_examples()]


# The plain script: every process defines everything at the top of its __main__ (what
# "on all workers" means in a script), master runs the driver's parts.
SCRIPT = "# definitions\n" + JOIN + """
import json
if RANK == 0:
    for part in json.loads(sys.argv[4]):
        print("--- part", flush=True)
        try:
            exec(part)
        except Exception as e:
            print(f"{type(e).__name__}: {str(e).splitlines()[0]}")
rpc.shutdown()
"""


def raw_torch(tmp_path, pids) -> list[str]:
    """What the plain script's master printed, part by part."""
    source = SCRIPT.replace("# definitions\n", definitions())
    master = run_ranks(tmp_path, pids, source, args=(json.dumps(driver_parts()),))[0]
    return master.split("--- part\n")[1:]


def in_notebook(ip, cluster) -> list[str]:
    """What the same parts print in the notebook's shell, with the definitions run on
    every worker (``%%rpc_on all``) and in the notebook."""
    cluster.run(definitions(), targets="all")
    run(ip, definitions())
    printed = []
    try:
        for part in driver_parts():
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                result = ip.run_cell(part, store_history=False)
            text = out.getvalue()
            if result.error_in_exec is not None:  # IPython showed the traceback: keep its line
                error = result.error_in_exec
                text = text.split("-" * 75, 1)[0] + f"{type(error).__name__}: {str(error).splitlines()[0]}\n"
            printed.append(text)
    finally:
        release_profiling_key()  # the cells ran on this process's main thread, which later modules share
    return printed


def test_every_kind_of_callable_and_the_docstring_examples_as_under_raw_torch(shell, cluster, tmp_path, pids):
    script = raw_torch(tmp_path, pids)
    notebook = in_notebook(shell, cluster)
    assert len(script) == len(notebook) == 1 + len(docstring_examples())
    kinds = script[0].splitlines()
    # each kind through each form, plain and profiled, and the four proxies; then torch's
    # profiling key, left set by the profiled ScriptFunction calls
    assert len(kinds) == 2 * (5 * 3 + 4) + 1, kinds
    assert kinds[-1] == ("legacy profiler after them -> RuntimeError: Cannot call "
                         "RemoteProfilerManager::setCurrentKey when current key is already set."), kinds[-1]
    assert "rpc_sync async_execution of a ScriptFunction -> tensor([0., 2., 4., 6.])" in kinds
    assert "profiled remote async_execution of a Python function -> tensor([1., 3., 5., 7.])" in kinds
    assert "profiled ScriptModule rpc_sync().forward -> tensor([0., 0., 1., 2.])" in kinds
    assert notebook[0].splitlines() == kinds
    # the docstring's examples, as written: raw torch's values, and raw torch's error
    # where the example passes an int for a Tensor argument
    assert notebook[1:] == script[1:]
    assert script[1] == "tensor([3., 3.])\n"
    assert script[2].startswith("RuntimeError: async_add() Expected a value of type 'Tensor' for argument 'y'")
    assert script[3] == "tensor([4., 4.])\n" * 2 and script[4] == "tensor([4., 4.])\n" * 3
