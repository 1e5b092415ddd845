"""Reference solutions of lab 2, distributed autograd: one section per exercise cell.

``python -m nbrpc.lab solve ../02_dist_autograd.ipynb -o KEY.ipynb`` puts each section in
place of the exercise cell named after ``# %%``. Not for students.
"""

# %% dist_autograd.grad_through_rpc
def grad_through_rpc(worker, fn, x):
    """d/dx of fn(x).sum(), with fn run on `worker`."""
    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync(worker, fn, args=(x,)).sum()
        dist_autograd.backward(context_id, [loss])
        return dist_autograd.get_gradients(context_id)[x]

# %% dist_autograd.grad_of_w
def owner_grad(context_id, model_rref):
    """Runs on the owner of model_rref: this context's gradient of the model's w."""
    return dist_autograd.get_gradients(context_id)[model_rref.local_value().w]


def grad_of_w(model_rref, x):
    """Gradient of model(x).sum() with respect to the model's w, read on its owner."""
    with dist_autograd.context() as context_id:
        loss = model_rref.rpc_sync().forward(x).sum()
        dist_autograd.backward(context_id, [loss])
        return rpc.rpc_sync(model_rref.owner(), owner_grad, args=(context_id, model_rref))

# %% dist_autograd.sgd_step
def sgd_step(model_rref, x, target, lr):
    """One SGD step on F.mse_loss(model(x), target) for the model on its owner; the loss."""
    optimizer = DistributedOptimizer(torch.optim.SGD, model_rref.rpc_sync().parameter_rrefs(), lr=lr)
    with dist_autograd.context() as context_id:
        loss = F.mse_loss(model_rref.rpc_sync().forward(x), target)
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)
    return loss.item()

# %% dist_autograd.train_split
def train_split(scale, shift, x, y, steps, lr):
    """Fit shift(scale(x)) to y with SGD through both workers; one loss per step."""
    params = scale.rpc_sync().parameter_rrefs() + shift.rpc_sync().parameter_rrefs()
    optimizer = DistributedOptimizer(torch.optim.SGD, params, lr=lr)
    losses = []
    for _ in range(steps):
        with dist_autograd.context() as context_id:
            out = shift.rpc_sync().forward(scale.rpc_sync().forward(x))
            loss = F.mse_loss(out, y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(loss.item())
    return losses
