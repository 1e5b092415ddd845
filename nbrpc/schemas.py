"""The snapshots the runtime hands to the widgets and to users, as typed dicts.

These are the one definition of their shape: ``rrefs.rref_snapshot`` and
``autograd.autograd_snapshot`` return them, the widgets read them, the README shows
them. They are plain JSON-serializable dicts (a widget syncs them as traits).
"""

from __future__ import annotations

from typing import Literal, TypedDict

from typing_extensions import NotRequired


class Member(TypedDict):
    """An RPC member: the driver or a worker."""

    name: str
    id: int  # its rank
    host: str
    pid: int


class RRefRow(TypedDict):
    """One RRef alive somewhere in the group."""

    id: str  # "<created_on>:<local_id>", torch's GloballyUniqueId
    owner: str
    creator: str
    holders: list[str]  # members holding a Python RRef object to it now
    type: str | None  # the value's type name, from its owner
    summary: str | None  # e.g. "Tensor[2, 3] float32"
    size: int | None  # bytes of tensors and module parameters
    call_site: str | None  # where the notebook made it
    confirmed: bool  # the owner knows of this user reference


# A step in an RRef's life, recorded by the member where it happened ("from" is a
# Python keyword, hence this form). ``t`` is time.time() on that member.
RRefEvent = TypedDict("RRefEvent", {
    "t": float, "kind": Literal["create", "fork", "fetch", "delete"], "rref": str,
    "from": str, "to": str,
})


class RRefSnapshot(TypedDict):
    """``nbrpc.rref_snapshot()``: every member, every live RRef, recent events (bounded)."""

    workers: list[Member]
    rrefs: list[RRefRow]
    events: list[RRefEvent]


class AutogradNode(TypedDict):
    """An autograd function (or a leaf's accumulator) on one member."""

    id: str  # "<worker>:<n>"
    worker: str
    name: str  # "AddBackward0", "SendRpcBackward", "RecvRpcBackward", "AccumulateGrad", ...
    param: NotRequired[str]  # a leaf's name: a notebook global or a module parameter
    message_id: NotRequired[int]  # send/recv functions: torch's autograd message id


class AutogradEdge(TypedDict):
    """Edges follow the backward pass: from a function to the next one it feeds."""

    src: str
    dst: str
    kind: Literal["local", "rpc"]  # rpc: a recv function to its send on another member


class Gradient(TypedDict):
    worker: str
    param: str
    shape: list[int]
    norm: float


class AutogradSnapshot(TypedDict):
    """``nbrpc.autograd_snapshot(context_id)``: one distributed autograd context."""

    context_id: int
    workers: list[str]  # members with functions in the context
    nodes: list[AutogradNode]
    edges: list[AutogradEdge]
    gradients: list[Gradient]  # filled after dist_autograd.backward
