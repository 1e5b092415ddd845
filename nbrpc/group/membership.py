"""The torch RPC group: the driver's membership for the life of its process, workers' joins.

torch binds its RRef bookkeeping to the first RPC agent a process creates and never
lets go, so a driver that shut RPC down and joined again would route ``owner()``,
forks and deletes through a dead agent. The driver therefore joins once (rank 0)
and stays; each cluster is a set of workers that join this group with fresh,
ever-increasing ranks (torch never frees a rank) and leave it at shutdown.

The driver hosts the rendezvous ``TCPStore`` on a socket nbrpc bound itself
(loopback for local clusters; torch's store would listen on every interface), and
membership is dynamic (no ``world_size``), so workers can join at any time.
"""

from __future__ import annotations

import atexit
import datetime
import os
import secrets
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from .._util import LOOPBACK, listening_ports, listening_socket, muted_stderr, raise_fd_limit, silence_torch_noise
from ..calls import patches
from ..errors import ClusterRunningError
from ..recording import recorder, rref_ledger
from ..wire import serialization
from ..wire.receivers import receivers
from . import DEFAULT_TRANSPORT, devices

DRIVER_RANK = 0
RELEASE_TIMEOUT = 5.0  # seconds a member waits for the others' RRef deletions as a cluster ends
# How long a call left waiting on an ending member may wait (s); it ends with the member.
UNTIL_THE_END_TIMEOUT = 60.0
# Keys torch keeps in the group's store: the join/leave lock and the member list.
TOKEN = torch_compat.STORE_LOCK_KEY
NAMES = torch_compat.STORE_MEMBERS_KEY


@dataclass
class DriverGroup:
    """This process's place in RPC as the driver: its store, key prefix and next rank."""

    store: dist.TCPStore
    prefix: str
    name: str
    threads: int
    key: bytes  # signs every RPC pickle of this group (see serialization)
    listeners: frozenset = frozenset()  # the TCP ports this process's RPC agent listens on
    next_rank: int = DRIVER_RANK + 1
    interface: str = "lo"  # where this process's TensorPipe listener is
    placement: devices.Placement = devices.CPU  # its devices and maps, fixed at its join
    transport: str = DEFAULT_TRANSPORT  # TensorPipe's transports, fixed at its join (see TRANSPORTS)

    def take_ranks(self, count: int) -> list[int]:
        ranks = list(range(self.next_rank, self.next_rank + count))
        self.next_rank += count
        return ranks

    def forget(self, workers: dict[str, int]) -> None:
        """Remove workers (name -> rank) that ended without leaving: what their own
        graceful leave would have done, so the names can join again; and what they held
        of this process's notebook code (``receivers``)."""
        receivers.forget()
        members = dist.PrefixStore(self.prefix, self.store)
        for name in workers.keys() & set(member_names()):
            drop_member(name)
        if members.check([NAMES]):
            listed = members.get(NAMES).decode()
            for name, rank in workers.items():
                listed = listed.replace(f"{name}-{rank},", "")
            members.set(NAMES, listed)
        release_token(members, workers)


def release_token(members: dist.Store, workers: Iterable[str]) -> None:
    """Free torch's join/leave lock if one of ``workers`` died holding it, and clear
    their old tokens.

    torch's ``_group_membership_management`` takes the lock as ``Token_for_NAME_join``
    or ``Token_for_NAME_leave``, and the next joiner waits for that key to read
    ``Done``. A worker killed mid-join, or mid-leave (its graceful leave calls every
    other member and blocks on one that is frozen), never releases it; what it would
    have written is written here, so the next cluster can join. The ``Done`` keys go
    once their workers have ended: a key left from an earlier cluster is found at once
    by every joiner that waits on a new worker of that name, and each such joiner would
    spin on the store until that worker's join ends (the store's thread used 3.4 s of
    CPU in a 7 s start of 16 workers). A token released here stays: a joiner may be
    about to wait on it.
    """
    tokens = [f"Token_for_{name}_{step}" for name in workers for step in ("join", "leave")]
    if members.check([TOKEN]):
        holder = members.get(TOKEN).decode()
        if holder in tokens:
            members.set(TOKEN, "")
            members.set(holder, "Done")
            tokens.remove(holder)  # a joiner may be about to wait on it
    for token in tokens:
        members.delete_key(token)


class GroupState:
    """This process's place in torch's group: the driver's one membership (None in a
    worker, or before the first cluster), kept until the process exits."""

    def __init__(self):
        self.driver: DriverGroup | None = None


GROUP = GroupState()


def driver_group(name: str, threads: int, timeout: float, store_timeout: float,
                 interface: str = "lo", placement: devices.Placement | None = None,
                 transport: str = DEFAULT_TRANSPORT, track: bool = True, trace: bool = False) -> DriverGroup:
    """Join RPC as the driver the first time; later calls reuse that membership. Either
    way the driver tracks RRefs (``track``) and records calls (``trace``) as this cluster
    asks, set up here and nowhere else.

    ``interface`` is where the driver's TensorPipe listener goes: ``lo`` for local
    workers, the interface that reaches them for workers on other machines.
    ``placement`` is the driver's devices and device maps; torch keeps the first
    join's for the life of the agent (its options are read once, in the constructor).
    """
    if GROUP.driver is None:
        if is_member():
            raise ClusterRunningError(
                "torch RPC is already initialized in this process (rpc.init_rpc was "
                "called); call rpc.shutdown() before starting an nbrpc cluster"
            )
        raise_fd_limit()
        store = host_store(LOOPBACK, 0, store_timeout)
        prefix = f"nbrpc-{uuid.uuid4().hex[:12]}"
        key = secrets.token_bytes(32)
        serialization.set_key(key)
        before = listening_ports(os.getpid())
        placement = placement or devices.CPU
        join(store, prefix, name, DRIVER_RANK, backend_options(threads, timeout, placement, transport),
             interface=interface, track=track, trace=trace)
        listeners = frozenset(listening_ports(os.getpid()) - before)
        GROUP.driver = DriverGroup(store, prefix, name, threads, key, listeners, interface=interface,
                                   placement=placement, transport=transport)
        atexit.register(_leave_at_exit)
    else:  # join set tracking and tracing up; a later cluster makes its own choice
        check_placement(placement)
        _check_reuse(name, interface, transport)
        patches.install(track)
        after_agent(trace)
    torch_compat.set_rpc_timeout(timeout)
    receivers.forget()  # an earlier cluster's worker of the same name holds nothing
    return GROUP.driver


def _check_reuse(name: str, interface: str, transport: str) -> None:
    """Refuse a cluster that this process's membership, joined for an earlier one, cannot serve."""
    driver = GROUP.driver
    if not is_member():
        raise ClusterRunningError(
            "RPC was shut down in this process outside nbrpc (rpc.shutdown()); torch "
            "cannot rejoin with working RRefs in the same process: restart the kernel"
        )
    elif driver.listeners and not driver.listeners & listening_ports(os.getpid()):
        raise ClusterRunningError(
            "this process's RPC agent stopped accepting connections (torch's TensorPipe "
            "does so after a connection that closes before its handshake: a port scan, "
            "say), so no worker can join it: restart the kernel to start a cluster"
        )
    elif transport != driver.transport:
        raise ClusterRunningError(
            f"this process joined RPC with the {driver.transport!r} transport (for its first "
            f"cluster) and torch cannot change an agent's transports: start this cluster with "
            f"--transport {driver.transport} (or leave it out), or restart the kernel to use "
            f"{transport!r}"
        )
    elif name != driver.name:
        raise ValueError(
            f"this process joined RPC as {driver.name!r} and keeps that name until it "
            f"exits (torch binds RRefs to its first RPC agent); use --driver-name "
            f"{driver.name} or restart the kernel to take the name {name!r}"
        )
    elif interface not in ("lo", driver.interface):
        raise ClusterRunningError(
            f"this process joined RPC listening on {driver.interface!r} (for an earlier "
            f"cluster) and torch cannot move that listener to {interface!r}, where workers on "
            "other machines could reach it: restart the kernel and start this cluster first"
        )


def check_placement(placement: devices.Placement | None) -> None:
    """Refuse devices or maps that this process's driver agent, if it has joined, lacks."""
    if GROUP.driver is not None and placement:
        devices.check_driver(GROUP.driver.placement, placement)


def driver_name() -> str | None:
    """The RPC name this process joined with as the driver, or None before its first cluster."""
    return GROUP.driver.name if GROUP.driver is not None else None


def drop_member(name: str) -> None:
    """Forget worker ``name`` in this process's agent (it died or was ended)."""
    agent = torch_compat.current_agent()
    for info in agent.get_worker_infos():
        if info.name == name:
            torch_compat.update_group_membership(agent, info, [], {}, False)


def host_store(bind: str, port: int, timeout: float) -> dist.TCPStore:
    """Start the rendezvous store on ``bind:port`` (0: a free port)."""
    sock = listening_socket(bind, port)
    # The store takes ownership of the descriptor and closes it when it ends.
    return dist.TCPStore(
        bind,
        0,
        is_master=True,
        master_listen_fd=sock.detach(),
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


def connect_store(host: str, port: int, timeout: float) -> dist.TCPStore:
    """Connect to a rendezvous store hosted by the driver."""
    return dist.TCPStore(
        host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout)
    )


# The transports a member's TensorPipe agent uses. "uv" (TCP; the default) sleeps
# until a message comes. "shm" is torch's own default (shared memory first, then uv):
# its reactor thread busy-polls a whole core in every member from join to shutdown,
# for faster small calls. Big tensors go through the cma channel with either.
TRANSPORTS = {DEFAULT_TRANSPORT: ["uv"], "shm": None}


def backend_options(threads: int, timeout: float, placement: devices.Placement | None = None,
                    transport: str = DEFAULT_TRANSPORT) -> rpc.TensorPipeRpcBackendOptions:
    """TensorPipe options with ``transport`` (see ``TRANSPORTS``) and ``placement``'s devices
    and maps; the transports only take effect in the constructor."""
    chosen = TRANSPORTS[transport]
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=threads, rpc_timeout=timeout,
        **({} if chosen is None else {torch_compat.TRANSPORTS_OPTION: chosen}),
        **devices.backend_kwargs(placement),
    )


def driver_transport() -> str | None:
    """The transport this process joined RPC with, or None before its first cluster."""
    return GROUP.driver.transport if GROUP.driver is not None else None


def join(
    store: dist.Store,
    prefix: str,
    name: str,
    rank: int,
    options: rpc.TensorPipeRpcBackendOptions,
    interface: str | None = "lo",
    track: bool = True,
    trace: bool = False,
) -> None:
    """Initialize RPC in this process as ``name``/``rank`` of the group in ``store``, with
    every nbrpc patch of torch in place first; ``track`` turns RRef tracking on (see
    ``rref_ledger``), ``trace`` call recording (see ``recording.recorder``)."""
    if interface:
        # TensorPipe's TCP transport listens on this interface (read at agent start).
        os.environ["TP_SOCKET_IFNAME"] = interface
    if options.devices:
        # Peers may send CUDA tensors as soon as the agent is up (torch's static
        # groups do the same before their agent starts).
        import torch

        torch.cuda.init()
    before_agent(track)
    # init_rpc's own steps between its store and its backend (see ARCHITECTURE.md,
    # "What a member's join does"), in its order.
    torch_compat.log_api_usage(torch_compat.INIT_RPC_USAGE)
    torch_compat.count_init()
    torch_compat.init_dist_autograd(rank)
    torch_compat.set_profiler_node_id(rank)
    torch_compat.init_rpc_backend(
        rpc.BackendType.TENSORPIPE,
        dist.PrefixStore(prefix, store),
        name,
        rank,
        None,
        options,
    )
    after_agent(trace)


def before_agent(track: bool = True) -> None:
    """What a member does before its agent starts: every nbrpc patch of torch
    (``calls.patches``), torch's noise silenced. ``join`` runs it; so does anything
    that starts torch's agent itself and wants nbrpc's behaviour (the conformance
    harness runs torch's own RPC tests this way)."""
    patches.install(track)
    silence_torch_noise()


def after_agent(trace: bool = False) -> None:
    """What a member does once its agent is up: an empty RRef ledger, call recording
    on (``trace``) or in ``nbrpc.trace()`` blocks only."""
    rref_ledger.reset()
    recorder.install(trace)


def release_rrefs(timeout: float = RELEASE_TIMEOUT) -> None:
    """Delete this member's RRefs on their owners, and wait (at most ``timeout`` s)
    until the others deleted theirs on this one. Every member of a cluster does this at
    once as the cluster ends: an RRef dropped later would ask an owner that is gone
    (torch prints the failure), and a value the driver owns would be kept for good."""
    if is_member():
        torch_compat.delete_all_rrefs(datetime.timedelta(seconds=timeout))


def close_connections_at_their_end(names: Iterable[str]) -> None:
    """Have this process's connections to the members ``names`` close as they end.

    torch keeps its connection to every member it called for the life of its agent (a
    member's leave drops the name, not the connection) and reads one only while a reply
    is due, so it never sees the other end close: a driver kept 4 half-closed sockets
    (CLOSE_WAIT) for every worker it had called, for good. A call left waiting on each
    member (``_until_the_end``) has torch read as the member ends and close its end."""
    if not is_member():
        return
    for name in names:
        try:
            torch_compat.invoke_rpc(name, _until_the_end, torch_compat.RPCExecMode.ASYNC, None, None,
                                    UNTIL_THE_END_TIMEOUT)
        except RuntimeError:  # no longer in the group
            pass


@rpc.functions.async_execution
def _until_the_end() -> torch.futures.Future:
    """A reply that never comes: the member ends first (no thread waits for it)."""
    return torch.futures.Future()


def leave(graceful: bool, timeout: float) -> None:
    """Shut RPC down in this process; ``graceful`` tells the others first."""
    if not is_member():
        return
    if graceful:
        rpc.shutdown(graceful=True, timeout=timeout)
    else:
        rpc.shutdown(graceful=False)


def _leave_at_exit() -> None:
    with muted_stderr():  # the agent's own pipes report closing
        leave(graceful=False, timeout=0)


def is_member() -> bool:
    """True while this process has an RPC agent."""
    return torch_compat.has_agent()


def calls_in_flight() -> int:
    """How many RPCs this process sent and still awaits (0 outside a group)."""
    if not is_member():
        return 0
    info = torch_compat.current_agent().get_debug_info()
    return int(info.get("agent.client_active_calls", 0))


def calls_drained(within: float) -> bool:
    """Wait at most ``within`` s for this process's outstanding RPCs (RRef deletes just
    sent, say) to end; whether they did."""
    deadline = time.monotonic() + within
    while calls_in_flight():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def member_names() -> list[str]:
    """Names this process's agent knows, itself included."""
    return [info.name for info in torch_compat.current_agent().get_worker_infos()]
