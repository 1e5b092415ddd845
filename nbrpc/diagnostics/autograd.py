"""Distributed autograd, as data: one context's graph across every worker.

A distributed autograd graph exists only in pieces: each member holds, per context,
the ``SendRpcBackward`` functions torch attached to tensors it sent and the
``RecvRpcBackward`` functions of tensors it received, keyed by autograd message id
(whose top 16 bits are the sending worker's id). ``autograd_snapshot`` asks every
member (in parallel) to walk its local graph from its send functions (and the
driver's roots), then joins each recv to the send with the same message id.

Edges follow the backward pass: a ``local`` edge goes from a function to one of its
``next_functions``, an ``rpc`` edge from a recv function to the send function on the
worker that sent the tensor; so the whole graph is a DAG from the loss to the leaves.

A context is erased when its ``with dist_autograd.context()`` block exits. Inside the
block, snapshot directly; to look afterwards, ``record_autograd()`` snapshots each
context at every ``dist_autograd.backward`` the driver runs, with its gradients.
"""

from __future__ import annotations

import collections
import gc
import sys

import torch
import torch.distributed.autograd as dist_autograd

from .._compat import torch_compat
from ..calls import backward
from ..calls.fanout import ask_members
from ..errors import AutogradContextError
from ..schemas import AutogradSnapshot

__all__ = ["autograd_snapshot", "record_autograd"]

RECORDINGS_KEPT = 16
_MESSAGE_KINDS = {"SendRpcBackward": "send", "RecvRpcBackward": "recv"}

_recorded: collections.OrderedDict[int, dict] = collections.OrderedDict()


def autograd_snapshot(context_id: int, roots=None, timeout: float = 10.0) -> AutogradSnapshot:
    """The graph of distributed autograd context ``context_id`` on every worker.

    Parameters
    ----------
    context_id
        The id ``with dist_autograd.context() as context_id`` gave.
    roots
        Tensors to walk back from on this process (the loss), so the graph shows
        the computation after the last RPC too; without them, the walk starts at
        the send functions only.

    Returns an ``nbrpc.schemas.AutogradSnapshot``: ``context_id``, ``workers``, ``nodes``,
    ``edges`` and ``gradients`` (filled once ``dist_autograd.backward`` has run).
    """
    roots = [t.grad_fn for t in _tensors(roots)]
    # A context this member made and released is gone, though the others may still
    # be dropping their parts of it (torch tells them after the block, without waiting).
    pieces = [] if _released_here(context_id) else ask_members(
        local_graph, (context_id,), timeout, here=lambda: local_graph(context_id, roots))
    # The snapshot's own calls carry the context to every member: one with no
    # functions in it took no part.
    pieces = [p for p in pieces if p is not None and p["nodes"]]
    if not pieces:
        if context_id in _recorded:
            return _recorded[context_id]
        raise AutogradContextError(_missing_message(context_id))
    return join(context_id, sorted(pieces, key=lambda p: p["id"]))


def record_autograd(enabled: bool = True) -> None:
    """Snapshot each context at every ``dist_autograd.backward`` this process runs.

    Read the recordings after the ``with`` block with ``autograd_snapshot(context_id)``
    or ``last_recorded()``; the latest few contexts are kept. Each recording costs
    one snapshot (a call to every worker) per backward: turn it on to look, then off.
    """
    if enabled:
        backward.AFTER_BACKWARD.add(_record)
    else:
        backward.AFTER_BACKWARD.discard(_record)


def last_recorded() -> dict:
    """The most recent recorded snapshot."""
    if not _recorded:
        raise AutogradContextError(
            "no distributed autograd context was recorded: call nbrpc.record_autograd() "
            "before the step whose dist_autograd.backward you want to see"
        )
    return next(reversed(_recorded.values()))


def _record(context_id: int, roots: list) -> None:
    _recorded[context_id] = autograd_snapshot(context_id, roots=roots)
    while len(_recorded) > RECORDINGS_KEPT:
        _recorded.popitem(last=False)


def _missing_message(context_id: int) -> str:
    return (
        f"no distributed autograd context {context_id} exists on any worker: a context "
        "ends when its `with dist_autograd.context()` block exits. Take the snapshot "
        "inside the block, or call nbrpc.record_autograd() first and read "
        f"nbrpc.autograd_snapshot({context_id}) after the block (recorded at "
        "dist_autograd.backward)."
    )


def _tensors(roots) -> list:
    if roots is None:
        return []
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    return [t for t in roots if t.grad_fn is not None]


# -- one member's piece ----------------------------------------------------------


def _released_here(context_id: int) -> bool:
    """True if this member created context ``context_id`` and no longer has it."""
    if torch_compat.context_creator(context_id) != torch_compat.current_agent().get_worker_info().id:
        return False
    try:
        torch_compat.retrieve_context(context_id)
    except RuntimeError:
        return True
    return False


def local_graph(context_id: int, roots: list | None = None) -> dict | None:
    """This member's part of a context's graph, or None if it took no part."""
    try:
        ctx = torch_compat.retrieve_context(context_id)
    except RuntimeError:
        return None
    me = torch_compat.current_agent().get_worker_info()
    walk = _Walk(me.name)
    for message_id, fn in sorted(torch_compat.send_functions(ctx).items()):
        walk.visit(fn, message_id)
    for fn in roots or []:
        walk.visit(fn)
    for message_id, fn in sorted(torch_compat.recv_functions(ctx).items()):
        walk.visit(fn, message_id)
    grads = dist_autograd.get_gradients(context_id)
    names = _parameter_names() if walk.leaves or grads else {}
    for node, tensor in walk.leaves:
        node["param"] = names.get(id(tensor)) or _unnamed(tensor)
    gradients = [
        dict(worker=me.name, param=names.get(id(t)) or _unnamed(t), shape=list(g.shape),
             norm=round(float(g.norm()), 6))
        for t, g in grads.items()
    ]
    return dict(name=me.name, id=me.id, nodes=walk.nodes, edges=walk.edges,
                known=sorted(torch_compat.known_worker_ids(ctx)),
                gradients=sorted(gradients, key=lambda g: g["param"]))


class _Walk:
    """Depth-first walk over ``next_functions``, numbering functions as first seen."""

    def __init__(self, worker: str):
        self.worker = worker
        self.ids: dict = {}  # function -> node id; keeps the functions alive meanwhile
        self.nodes: list[dict] = []
        self.edges: list[dict] = []
        self.linked: set[tuple[str, str]] = set()
        self.leaves: list[tuple[dict, torch.Tensor]] = []

    def visit(self, fn, message_id: int | None = None) -> str:
        stack = [fn]
        root_id = self._add(fn, message_id)
        while stack:
            current = stack.pop()
            for child, _ in reversed(current.next_functions):
                if child is None:
                    continue
                seen = child in self.ids
                edge = (self.ids[current], self._add(child))
                if edge not in self.linked:
                    self.linked.add(edge)
                    self.edges.append(dict(src=edge[0], dst=edge[1], kind="local"))
                if not seen:
                    stack.append(child)
        return root_id

    def _add(self, fn, message_id: int | None = None) -> str:
        if fn in self.ids:
            node = self.nodes[int(self.ids[fn].rsplit(":", 1)[1])]
        else:
            self.ids[fn] = f"{self.worker}:{len(self.nodes)}"
            node = dict(id=self.ids[fn], worker=self.worker, name=fn.name().rsplit("::", 1)[-1])
            self.nodes.append(node)
            if hasattr(fn, "variable"):
                self.leaves.append((node, fn.variable))
        if message_id is not None and node["name"] in _MESSAGE_KINDS:
            node["message_id"] = message_id
        return self.ids[fn]


def _parameter_names() -> dict[int, str]:
    """id(tensor) -> the name a person knows it by: a global of ``__main__``, else
    its parameter name in the outermost module that owns it."""
    names: dict[int, str] = {}
    main = sys.modules.get("__main__")
    for key, value in list(vars(main).items()) if main else []:
        if isinstance(value, torch.Tensor) and not key.startswith("_"):
            names.setdefault(id(value), key)
    # type(), not isinstance: some of torch's module-level objects warn when asked
    # for their __class__.
    module_type = torch.nn.Module
    modules = [o for o in gc.get_objects() if issubclass(type(o), module_type)]
    inner = {id(child) for m in modules for child in m.children()}
    for m in modules:
        if id(m) not in inner:
            for name, p in m.named_parameters():
                names.setdefault(id(p), name)
    return names


def _unnamed(tensor: torch.Tensor) -> str:
    return f"tensor[{', '.join(str(d) for d in tensor.shape)}]"


# -- the whole graph -------------------------------------------------------------


def join(context_id: int, pieces: list[dict]) -> AutogradSnapshot:
    """Join members' pieces with ``rpc`` edges (pure: unit-testable)."""
    sends = {n["message_id"]: n["id"] for p in pieces for n in p["nodes"]
             if _MESSAGE_KINDS.get(n["name"]) == "send" and "message_id" in n}
    rpc_edges = [
        dict(src=n["id"], dst=sends[n["message_id"]], kind="rpc")
        for p in pieces for n in p["nodes"]
        if _MESSAGE_KINDS.get(n["name"]) == "recv" and n.get("message_id") in sends
    ]
    return dict(
        context_id=context_id,
        workers=[p["name"] for p in pieces],
        nodes=[n for p in pieces for n in p["nodes"]],
        edges=[e for p in pieces for e in p["edges"]] + rpc_edges,
        gradients=[g for p in pieces for g in p["gradients"]],
    )
