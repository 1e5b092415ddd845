"""Reference solutions of lab 3, a parameter server: one section per exercise cell.

``python -m nbrpc.lab solve ../03_param_server.ipynb -o KEY.ipynb`` puts each section in
place of the exercise cell named after ``# %%``. Not for students.
"""

# %% param_server.parameter_rrefs
def parameter_rrefs(module):
    """One RRef per parameter of module, owned by this process (run it on the owner)."""
    return [RRef(p) for p in module.parameters()]

# %% param_server.train_step
def train_step(ps_rref, optimizer, x, y):
    """One distributed step on the batch (x, y); the batch's loss."""
    with dist_autograd.context() as context_id:
        loss = F.cross_entropy(ps_rref.rpc_sync().forward(x), y)
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)
    return loss.item()

# %% param_server.run_training
def run_training(trainers, epochs):
    """Train every trainer for `epochs` epochs, all at once; each trainer's losses."""
    losses = [[] for _ in trainers]
    for _ in range(epochs):
        futures = [trainer.rpc_async().train_epoch() for trainer in trainers]
        for mine, future in zip(losses, futures):
            mine += future.wait()
    return losses

# %% param_server.busiest
def busiest(snapshot):
    """The member whose calls ran longest, overlapping calls counted once; its share of the window."""
    runs = {}
    for call in snapshot["calls"]:
        if call["began"] is not None and call["ended"] is not None:
            runs.setdefault(call["callee"], []).append((call["began"], call["ended"]))
    busy = {}
    for worker, intervals in runs.items():
        total, covered = 0.0, float("-inf")
        for began, ended in sorted(intervals):
            if ended > covered:
                total += ended - max(began, covered)
                covered = ended
        busy[worker] = total
    worker = max(busy, key=busy.get)
    return worker, busy[worker] / (snapshot["end"] - snapshot["start"])
