"""The devices of this process's TensorPipe agent, which torch's RPC futures carry.

torch makes the future of every RPC with its agent's devices: when it completes, it
records an event on the current stream of each device its value uses; ``wait`` and
``value`` make the caller's current streams wait for those events, every callback
(``then``, ``add_done_callback``) runs on fresh streams that wait for them, and a
future ``then`` makes has the same devices. A future made in Python without devices
is CPU-only and does none of this: a ``NamedFuture`` (``wrappers``) that wraps torch's
future must have its devices, or a CUDA value read on another stream, or sent on by
an ``@async_execution`` function, races the kernels that make it.

torch has no getter for an agent's devices, so ``AgentDevices`` follows them where
torch sets them: the agent's constructor (a static group's devices) and its
``_update_group_membership`` (a dynamic group's joins and leaves, and nbrpc's
``group.devices.install``), by the rules of ``TensorPipeAgent::updateGroupMembership``
(a join adds the devices it lacks, a leave keeps only the devices it is given);
known to work with torch 2.11 to 2.15.
"""

from __future__ import annotations

import threading

import torch

from .._compat import torch_compat

_torch_agent_init = torch_compat.agent_init
_torch_update_group_membership = torch_compat.agent_update_group_membership


class AgentDevices:
    """This process's agent's devices (empty: CPU only)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._devices: list[torch.device] = []  # replaced, never changed in place

    def current(self) -> list[torch.device]:
        return self._devices

    def constructed(self, devices) -> None:
        with self._lock:
            self._devices = _unique(devices)

    def updated(self, devices, joined: bool) -> None:
        with self._lock:
            given = _unique(devices)
            if joined:
                self._devices = self._devices + [d for d in given if d not in self._devices]
            else:
                self._devices = [d for d in self._devices if d in given]


def _unique(devices) -> list[torch.device]:
    found: list[torch.device] = []
    for device in devices or ():
        device = torch.device(device)
        if device not in found:
            found.append(device)
    return found


AGENT_DEVICES = AgentDevices()
current = AGENT_DEVICES.current


def _agent_init(agent, *args, **kwargs):
    _torch_agent_init(agent, *args, **kwargs)
    # (store, name, rank, world_size, options, reverse_device_maps, devices)
    AGENT_DEVICES.constructed(kwargs["devices"] if "devices" in kwargs else args[6] if len(args) > 6 else [])


def _update_group_membership(agent, worker_info, devices, reverse_device_maps, joined):
    result = _torch_update_group_membership(agent, worker_info, devices, reverse_device_maps, joined)
    AGENT_DEVICES.updated(devices, joined)
    return result


def install() -> None:
    """Follow the agent's devices from its construction on (idempotent; before the agent starts)."""
    torch_compat.patch(torch_compat.AGENT_INIT, _agent_init)
    torch_compat.patch(torch_compat.AGENT_GROUP_MEMBERSHIP, _update_group_membership)
