"""The snapshots the runtime hands to the widgets and to users, as typed dicts.

These are the one definition of their shape: ``rrefs.rref_snapshot`` and
``autograd.autograd_snapshot`` return them, the widgets read them, the documentation shows
them (docs/guide/views.md). They are plain JSON-serializable dicts (a widget syncs them as traits).
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


class Bytes(TypedDict):
    """What one message carried: tensor data and the pickle around it, apart."""

    tensor: int
    pickle: int


class CallRecord(TypedDict):
    """One RPC, assembled from its caller's and its callee's records.

    Times are seconds on the driver's clock (``time.monotonic()`` of the driver;
    members on other machines are corrected by their estimated offset). A time the
    record lacks (the callee's part of a call to a member that left, a reply that
    never came) is None.
    """

    id: str  # "<caller>:<n>", unique in the group
    caller: str
    callee: str
    # How it was made: rpc_sync, rpc_async, remote, to_here, rref_helper (rref.rpc_sync().m()),
    # autograd (a backward pass's gradients), optimizer (DistributedOptimizer.step), internal.
    kind: str
    name: str  # the qualified function name, or torch's message type for internal calls
    sent: float  # the caller sent it
    began: float | None  # a thread of the callee began running it
    ended: float | None  # ... and ended
    replied: float | None  # the reply arrived at the caller
    thread: str | None  # the callee's thread that ran it
    request: Bytes
    reply: Bytes | None
    parent: str | None  # the call during which the caller sent this one (nesting)
    context: int | None  # the distributed autograd context, if any
    rref: str | None  # the RRef it made or used, if any
    error: str | None  # "ExceptionClass: message" when it failed


class ClockEstimate(TypedDict):
    """How a member's clock maps to the driver's: ``driver = local + offset``,
    good to ``bound`` seconds (0 for members on the driver's machine)."""

    worker: str
    offset: float
    bound: float


class TraceSnapshot(TypedDict):
    """``t.snapshot()`` of ``nbrpc.trace()``, or a cluster's recording: the calls whose
    ``sent`` lies in [start, end], merged from every member (bounded per member)."""

    workers: list[Member]
    calls: list[CallRecord]
    clocks: list[ClockEstimate]
    start: float
    end: float
    dropped: int  # records lost to a member's bounded ring in that window
