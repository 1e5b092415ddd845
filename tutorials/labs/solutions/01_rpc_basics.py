"""Reference solutions of lab 1, RPC and RRefs: one section per exercise cell.

``python -m nbrpc.lab solve ../01_rpc_basics.ipynb -o KEY.ipynb`` puts each section in
place of the exercise cell named after ``# %%``. Not for students.
"""

# %% rpc_basics.square_on
def square_on(worker, x):
    """square_here(x), computed on `worker`."""
    return rpc.rpc_sync(worker, square_here, args=(x,))

# %% rpc_basics.ask_all
def ask_all(workers, seconds):
    """slow_hello(seconds) on every worker at once; the answers, in `workers` order."""
    futures = [rpc.rpc_async(worker, slow_hello, args=(seconds,)) for worker in workers]
    return [future.wait() for future in futures]

# %% rpc_basics.make_counter
def make_counter(worker, start):
    """An RRef to a Counter(start) that lives on `worker`."""
    return rpc.remote(worker, Counter, args=(start,))

# %% rpc_basics.add_remote
def add_remote(counter_rref, n):
    """Add n to the Counter behind counter_rref, on its owner; return the new count."""
    return counter_rref.rpc_sync().add(n)

# %% rpc_basics.double_on_owner
def double_there(rref):
    """Runs on the owner of rref: double the tensor it holds, in place."""
    rref.local_value().mul_(2)


def double_on_owner(rref):
    """Run double_there on the worker that owns rref."""
    rpc.rpc_sync(rref.owner(), double_there, args=(rref,))
