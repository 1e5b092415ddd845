"""The calls of the differential check, made from the caller (rank 0), and what the
callees run. ``run(request)`` takes a JSON request and gives JSON facts:

- ``{"scenario": spec}``: a generated message (``messages``) sent by one call form to one
  kind of callable; the facts are what the callee saw after writing through one of its
  arguments, and what the caller got back beside what it sent.
- ``{"case": name, ...}``: an error or a timeout (``CASES``); the facts are the error's
  class, its builtin bases, its text and, for a timeout, the seconds it took.
- ``{"example": name}``: one of torch's documented examples (``EXAMPLES``).

A raw torch process imports this module; the nbrpc cluster runs it as a notebook cell
(the lines importing from ``differential`` left out: the cells of ``messages`` and
``scripted`` ran before), so its functions travel by value, as a notebook's do.
"""

import time

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn, optim
from torch.distributed.nn.api.remote_module import RemoteModule
from torch.distributed.optim import DistributedOptimizer

from differential.messages import describe, make_message, tensors_in, write_through
from differential.scripted import async_script_receive, docs_async_add, my_script_add, script_receive

# --- what the callees run ---------------------------------------------------------------

def receive(write, *items):
    """Write through one argument, then tell what every argument shows; send them back."""
    wrote = write_through(tensors_in(items), write)
    return {"seen": describe(items), "wrote": wrote}, items


def pick(index, *items):
    """One argument back as it is (a plain value's reply is pickled in C)."""
    return items[index]


@rpc.functions.async_execution
def async_receive(to, write, *items):
    return rpc.rpc_async(to, receive, args=(write, *items))


class Holder:
    """A class whose methods are called through an RRef's proxies."""

    def receive(self, write, *items):
        return receive(write, *items)

    def pick(self, index, *items):
        return items[index]


def raise_value_error(n):
    raise ValueError(f"bad value {n}")


def make_generator(n):
    return (i for i in range(n))


def sleep_for(seconds):
    time.sleep(seconds)
    return seconds


# --- the caller's side ---------------------------------------------------------------------

BUILTINS = {"add": torch.add, "mul": torch.mul}


def target(spec, items, leaves):
    """The callable and arguments of a scenario's call."""
    kind, write, to_next = spec["kind"], spec["write"], spec.get("next", "worker2")
    if kind == "function":
        return receive, (write, *items)
    if kind == "pick":
        return pick, (spec["pick"], *items)
    if kind == "async":
        return async_receive, (to_next, write, *items)
    if kind == "builtin":
        return BUILTINS[spec["op"]], (leaves[0], 2)
    if kind == "script":
        return script_receive, (write, list(leaves))
    if kind == "async_script":
        return async_script_receive, (to_next, write, list(leaves))
    raise ValueError(f"unknown kind {kind!r}")


def invoke(form, to, func, args, timeout=None):
    """``func(*args)`` on ``to`` through one of torch's call forms."""
    extra = {} if timeout is None else {"timeout": timeout}
    if form == "rpc_sync":
        return rpc.rpc_sync(to, func, args=args, **extra)
    if form == "rpc_async":
        return rpc.rpc_async(to, func, args=args, **extra).wait()
    if form == "remote":
        return rpc.remote(to, func, args=args).to_here(**extra)
    if form == "then":
        return rpc.rpc_async(to, func, args=args, **extra).then(lambda fut: fut.wait()).wait()
    raise ValueError(f"unknown form {form!r}")


def invoke_method(form, to, name, args):
    """``Holder().name(*args)`` on ``to`` through an RRef's proxy of ``form``."""
    rref = rpc.remote(to, Holder)
    if form == "rpc_sync":
        return getattr(rref.rpc_sync(), name)(*args)
    if form == "rpc_async":
        return getattr(rref.rpc_async(), name)(*args).wait()
    return getattr(rref.remote(), name)(*args).to_here()


RECEIVING = {"function", "async"}  # kinds whose callee runs ``receive``


def call(spec):
    """A scenario's facts: what the callee saw (for ``receive``) and what came back; under
    torch's legacy profiler (which sends a call torch's profiling way) if ``profiled``."""
    if spec.get("profiled"):
        with torch.autograd.profiler_legacy.profile():
            return call({**spec, "profiled": False})
    items, leaves = make_message(spec)
    if spec["kind"] == "method":
        name, first = ("pick", spec["pick"]) if "pick" in spec else ("receive", spec["write"])
        result = invoke_method(spec["form"], spec["to"], name, (first, *items))
    else:
        func, args = target(spec, items, leaves)
        result = invoke(spec["form"], spec["to"], func, args)
    facts = {}
    if spec["kind"] in RECEIVING or (spec["kind"] == "method" and "pick" not in spec):
        facts, result = result
    return {**facts, "round_trip": describe({"sent": items, "back": result})}


def attempt(make):
    """``make()``'s value described, or the facts of its error: one example's part."""
    began = time.monotonic()
    try:
        return describe(make())
    except Exception as e:  # compared
        return error_facts(e, began)


def error_facts(error, began):
    return {"error": type(error).__name__, "message": str(error)[:2000],
            "bases": [c.__name__ for c in type(error).__mro__ if c.__module__ == "builtins"],
            "seconds": round(time.monotonic() - began, 3)}


def answer(request):
    """The facts of one request (see the module's docstring)."""
    began = time.monotonic()
    try:
        if "scenario" in request:
            return {"result": call(request["scenario"])}
        if "case" in request:
            return {"result": CASES[request["case"]](**request.get("options", {}))}
        return {"result": EXAMPLES[request["example"]]()}
    except Exception as e:  # the facts compared
        return error_facts(e, began)


# --- errors and timeouts --------------------------------------------------------------------

def case_raises(form="rpc_sync"):
    return invoke(form, "worker1", raise_value_error, (3,))


def case_unpicklable_reply(form="rpc_sync"):
    return describe(invoke(form, "worker1", make_generator, (3,)))


def case_unpicklable_argument(form="rpc_sync"):
    return invoke(form, "worker1", pick, (0, (i for i in range(3))))


def case_unknown_worker(form="rpc_sync"):
    return invoke(form, "worker9", pick, (0, 1))


def case_timeout(form="rpc_sync", seconds=0.3):
    return invoke(form, "worker1", sleep_for, (2.0,), timeout=seconds)


def case_default_timeout(form="rpc_sync", seconds=0.3):
    kept = rpc.get_rpc_timeout()
    rpc._set_rpc_timeout(seconds)
    try:
        return invoke(form, "worker1", sleep_for, (2.0,))
    finally:
        rpc._set_rpc_timeout(kept)


CASES = {name[len("case_"):]: f for name, f in list(globals().items()) if name.startswith("case_")}


# --- torch's documented examples ------------------------------------------------------------

def example_rpc_sync():
    """torch.distributed.rpc.rpc_sync's docstring: a builtin, then a TorchScript function."""
    ret = rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 3))
    scripted = rpc.rpc_sync("worker1", my_script_add, args=(torch.ones(2), 3))
    return describe([ret, scripted])


def example_rpc_async():
    fut1 = rpc.rpc_async("worker1", torch.add, args=(torch.ones(2), 3))
    fut2 = rpc.rpc_async("worker1", min, args=(1, 2))
    result = fut1.wait() + fut2.wait()
    fut = rpc.rpc_async("worker1", my_script_add, args=(torch.ones(2), 3))
    return describe([result, fut.wait()])


def example_remote():
    rref1 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
    rref2 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
    x = rref1.to_here() + rref2.to_here()
    rref = rpc.remote("worker1", my_script_add, args=(torch.ones(2), 3))
    return describe([x, rref.to_here()])


def add_one_to_here(rref):
    return rref.to_here() + 1


def example_rref():
    """RRef's class docstring: from rpc.remote, from a local value, shared with a worker."""
    rref = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
    local = rpc.RRef(torch.zeros(2, 2))
    shared = rpc.rpc_sync("worker1", add_one_to_here, args=(local,))
    return describe([rref.to_here(), local.to_here(), local.is_owner(), rref.is_owner(),
                     rref.owner().name, shared])


def example_rref_proxies():
    """RRef.rpc_sync / rpc_async / remote's docstrings."""
    rref = rpc.remote("worker1", torch.add, args=(torch.zeros(2, 2), 1))
    return describe([list(rref.rpc_sync().size()), rref.rpc_sync().view(1, 4),
                     list(rref.rpc_async().size().wait()), rref.rpc_async().view(1, 4).wait(),
                     list(rref.remote().size().to_here()), rref.remote().view(1, 4).to_here()])


def sum_all(x):
    return x.sum()


def example_rref_backward():
    """RRef.backward's docstring, with an RRef that holds a loss."""
    torch.manual_seed(0)
    t1 = torch.rand((3, 3), requires_grad=True)
    with dist_autograd.context() as context_id:
        rref = rpc.remote("worker1", sum_all, args=(t1 * 2,))
        rref.backward(context_id)
        grads = dist_autograd.get_gradients(context_id)
        return describe([rref.to_here(), grads[t1]])


@rpc.functions.async_execution
def async_add_chained(to, x, y, z):
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


class AsyncExecutionClass:

    @staticmethod
    @rpc.functions.async_execution
    def static_async_add(to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    @classmethod
    @rpc.functions.async_execution
    def class_async_add(cls, to, x, y, z):
        ret_fut = torch.futures.Future()
        rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: ret_fut.set_result(fut.wait() + z))
        return ret_fut

    @rpc.functions.async_execution
    def bound_async_add(self, to, x, y, z):
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


def example_async_execution():
    """torch.distributed.rpc.functions.async_execution's docstring, every example."""
    ones = torch.ones(2)
    found = [attempt(lambda: rpc.rpc_sync("worker1", async_add_chained, args=("worker2", ones, 1, 1))),
             # as written (y is 1, not a Tensor: TorchScript refuses), then with a Tensor
             attempt(lambda: rpc.rpc_sync("worker1", docs_async_add, args=("worker2", ones, 1))),
             attempt(lambda: rpc.rpc_sync("worker1", docs_async_add, args=("worker2", ones, ones)))]
    for method in (AsyncExecutionClass.static_async_add, AsyncExecutionClass.class_async_add):
        found.append(attempt(lambda method=method: rpc.rpc_sync("worker1", method, args=("worker2", ones, 1, 2))))
    rref = rpc.remote("worker1", AsyncExecutionClass)
    found.append(attempt(lambda: rref.rpc_sync().static_async_add("worker2", ones, 1, 2)))
    found.append(attempt(lambda: rref.rpc_async().static_async_add("worker2", ones, 1, 2).wait()))
    found.append(attempt(lambda: rref.remote().static_async_add("worker2", ones, 1, 2).to_here()))
    found.append(attempt(lambda: rref.rpc_sync().bound_async_add("worker2", ones, 1, 2)))
    return found


def example_dist_autograd():
    """torch.distributed.autograd.context's and get_gradients' docstrings."""
    torch.manual_seed(0)
    with dist_autograd.context() as context_id:
        t1 = torch.rand((3, 3), requires_grad=True)
        t2 = torch.rand((3, 3), requires_grad=True)
        loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)
        remote_grads = [grads[t1], grads[t2]]
    with dist_autograd.context() as context_id:
        t1 = torch.rand((3, 3), requires_grad=True)
        t2 = torch.rand((3, 3), requires_grad=True)
        loss = t1 + t2
        dist_autograd.backward(context_id, [loss.sum()])
        grads = dist_autograd.get_gradients(context_id)
        return describe([loss, remote_grads, grads[t1], grads[t2]])


def example_distributed_optimizer():
    """DistributedOptimizer's docstring as written: its RRefs hold tensors that need no
    grad, so torch's backward refuses (the error is compared); then with parameters."""
    with dist_autograd.context() as context_id:
        rref1 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 3))
        rref2 = rpc.remote("worker1", torch.add, args=(torch.ones(2), 1))
        loss = rref1.to_here() + rref2.to_here()
        try:
            dist_autograd.backward(context_id, [loss.sum()])
            as_written = None
        except RuntimeError as e:
            as_written = [type(e).__name__, str(e).split("\n")[0]]
    with dist_autograd.context() as context_id:
        rref1 = rpc.remote("worker1", nn.Parameter, args=(torch.ones(2) + 3,))
        rref2 = rpc.remote("worker1", nn.Parameter, args=(torch.ones(2) + 1,))
        loss = rpc.rpc_sync("worker1", torch.add, args=(rref1.to_here(), rref2.to_here()))
        dist_autograd.backward(context_id, [(loss * loss).sum()])
        dist_optim = DistributedOptimizer(optim.SGD, [rref1, rref2], lr=0.05)
        dist_optim.step(context_id)
        return {"as_written": as_written, "stepped": describe([rref1.to_here(), rref2.to_here()])}


def example_remote_module():
    """RemoteModule's docstring (forward_async), and init_from_module_rref's."""
    remote_linear_module = RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))
    torch.manual_seed(0)
    input = torch.randn(128, 20)
    ret = remote_linear_module.forward_async(input).wait()
    weight, bias = (p.to_here() for p in remote_linear_module.remote_parameters())
    again = rpc.rpc_sync("worker1", RemoteModule.init_from_module_rref,
                         ("worker1/cpu", remote_linear_module.get_module_rref()))
    same = again.forward(input)
    return {"shape": list(ret.shape), "is_linear": torch.equal(ret, nn.functional.linear(input, weight, bias)),
            "again": type(again).__name__, "same": torch.equal(same, ret)}


EXAMPLES = {name[len("example_"):]: f for name, f in list(globals().items()) if name.startswith("example_")}
