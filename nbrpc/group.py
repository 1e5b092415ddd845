"""Join and leave a torch RPC group whose rendezvous store nbrpc owns.

torch's ``init_rpc`` builds its store from an ``init_method`` URL and prefixes keys
with a per-process counter, so a second cluster in the same driver process looks for
keys that fresh workers never write. Here the driver hosts one ``TCPStore`` per
cluster, listening on a socket nbrpc bound itself (loopback for local clusters; the
store would otherwise listen on every interface), every member uses the same
cluster-unique key prefix, and membership is dynamic (no ``world_size``): the driver
is rank 0 and each worker joins with a fresh rank.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api

from . import calls, serialization
from ._util import listening_socket, silence_torch_noise

DRIVER_RANK = 0


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


def backend_options(threads: int, timeout: float) -> rpc.TensorPipeRpcBackendOptions:
    """TensorPipe options; the default transports (shm, cma) are the fastest here."""
    return rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=threads, rpc_timeout=timeout
    )


def join(
    store: dist.Store,
    prefix: str,
    name: str,
    rank: int,
    options: rpc.TensorPipeRpcBackendOptions,
    interface: str | None = "lo",
) -> None:
    """Initialize RPC in this process as ``name``/``rank`` of the group in ``store``."""
    if interface:
        # TensorPipe's TCP transport listens on this interface (read at agent start).
        os.environ["TP_SOCKET_IFNAME"] = interface
    serialization.install()
    calls.install()
    silence_torch_noise()
    _forget_previous_group()
    dist_autograd._init(rank)
    rpc._init_rpc_backend(
        rpc.BackendType.TENSORPIPE,
        dist.PrefixStore(prefix, store),
        name,
        rank,
        None,
        options,
    )


def leave(graceful: bool, timeout: float) -> None:
    """Shut RPC down in this process; ``graceful`` tells the others first."""
    if not api._is_current_rpc_agent_set():
        return
    if graceful:
        rpc.shutdown(graceful=True, timeout=timeout)
    else:
        rpc.shutdown(graceful=False)


def is_member() -> bool:
    """True while this process has an RPC agent."""
    return api._is_current_rpc_agent_set()


def calls_in_flight() -> int:
    """How many RPCs this process sent and still awaits (0 outside a group)."""
    if not is_member():
        return 0
    info = api._get_current_rpc_agent().get_debug_info()
    return int(info.get("agent.client_active_calls", 0))


def member_names() -> list[str]:
    """Names this process's agent knows, itself included."""
    return [info.name for info in api._get_current_rpc_agent().get_worker_infos()]


def _forget_previous_group() -> None:
    """Drop state torch keeps per process from an earlier group.

    The all-gather bookkeeping is keyed by worker names, so a new group with the
    same names would start from the old sequence numbers that fresh workers lack.
    """
    with api._all_gather_dict_lock:
        api._all_gather_sequence_id.clear()
        api._all_gather_sequence_id_to_states.clear()
