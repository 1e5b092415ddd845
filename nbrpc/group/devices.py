"""GPU devices and device maps of a cluster's members (torch's CUDA RPC).

Parts:

- ``parse_device_maps``: the text form a person types (``--device-map``) into the
  mapping form of the API, ``{"worker1": {0: 1}, "worker1->worker2": {1: 0}}``.
- ``plan``: from the member names, the visible GPU count and the options, each
  member's ``Placement`` (its ``devices`` and its maps toward every other member),
  validated and consistent by construction: a map A -> B brings its inverse B -> A.
- ``backend_kwargs`` / ``Placement.to_json`` / ``Placement.from_json``: a placement
  as ``TensorPipeRpcBackendOptions`` arguments and as the text a worker's settings
  carry (see ``settings``).
- ``reverse_maps`` / ``install``: what each member must use for its replies, put
  into its agent after joins (see ``install`` for why torch's own join is not enough).

All of it is pure except ``install``; nothing here touches CUDA.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import DeviceMapError

__all__ = ["Placement", "install", "parse_device_maps", "plan", "reverse_maps"]

ARROW = "->"
_INDEX = re.compile(r"^(?:cuda:)?(\d+)$")
_EXAMPLE = 'e.g. "worker1=0:1" or "worker1=0:1,1:0;worker1->worker2=1:0"'


@dataclass(frozen=True)
class Placement:
    """One member's GPUs and its device maps toward the other members."""

    devices: tuple[int, ...] = ()
    maps: dict[str, dict[int, int]] = field(default_factory=dict)

    def label(self) -> str:
        """``cuda:0,cuda:1``, or ``cpu`` when the member uses no GPU."""
        return ",".join(f"cuda:{d}" for d in self.devices) or "cpu"

    def to_json(self) -> str | None:
        """This placement as text a worker starts with; None for a CPU worker."""
        if not self.devices:
            return None
        return json.dumps({"devices": list(self.devices),
                           "maps": {to: {str(a): b for a, b in m.items()} for to, m in self.maps.items()}})

    @staticmethod
    def from_json(text: str | None) -> Placement | None:
        """The placement ``to_json`` wrote, or None."""
        if not text:
            return None
        data = json.loads(text)
        return Placement(tuple(data["devices"]),
                         {to: {int(a): int(b) for a, b in m.items()} for to, m in data["maps"].items()})


CPU = Placement()


def parse_device_maps(text: str) -> dict[str, dict[int, int]]:
    """``"worker1=0:1,1:0;worker1->worker2=1:0"`` -> ``{"worker1": {0: 1, 1: 0}, ...}``.

    A map is ``[SOURCE->]TARGET=FROM:TO[,FROM:TO...]`` (SOURCE defaults to the
    driver); maps are separated by ``;`` and the same target may appear again.
    """
    maps: dict[str, dict[int, int]] = {}
    entries = [e.strip() for e in str(text).split(";") if e.strip()]
    if not entries:
        raise DeviceMapError(f"empty device map {text!r}: write TARGET=FROM:TO, {_EXAMPLE}")
    for entry in entries:
        key, sep, pairs = entry.partition("=")
        key = "".join(key.split())
        if not sep or not key or not pairs.strip():
            raise DeviceMapError(
                f"cannot read device map {entry!r}: write [SOURCE->]TARGET=FROM:TO[,FROM:TO], {_EXAMPLE}")
        target = maps.setdefault(key, {})
        for pair in pairs.split(","):
            src, colon, dst = pair.strip().partition(":")
            if not colon:
                raise DeviceMapError(f"cannot read {pair.strip()!r} in device map {entry!r}: write "
                                     f"FROM:TO with GPU indices, {_EXAMPLE}")
            a, b = _index(src, entry), _index(dst, entry)
            if a in target and target[a] != b:
                raise DeviceMapError(_not_one_to_one_from(key, a, target[a], b))
            target[a] = b
    return maps


def plan(names: list[str], gpu_count: int, gpus: bool = False,
         device_maps: Mapping | str | None = None, own_gpus: bool = False) -> dict[str, Placement]:
    """Each member's placement; ``names[0]`` is the driver, the rest are workers.

    ``gpus``: the driver on ``cuda:0``, worker k (k = 1, 2, ...) on GPU k modulo
    ``gpu_count``, and a map between every pair (each member's GPU to the other's).
    ``device_maps``: explicit maps, keys ``"TARGET"`` (from the driver) or
    ``"SOURCE->TARGET"``, values ``{from: to}`` GPU indices; they replace what
    ``gpus`` derived for that pair. Each map A -> B not given in reverse gets its
    inverse B -> A. Members with any GPU use their mapped GPUs; the driver uses
    every visible GPU (its devices are fixed at its first join, see ``group``).
    Without either option every member is on CPU (``{}``).

    ``own_gpus``: the workers run elsewhere with GPUs of their own (a Slurm task's,
    numbered from 0 in each), not the ``gpu_count`` GPUs of the driver's machine:
    with ``gpus`` each worker is on its own ``cuda:0``, and a driver without a GPU
    stays on CPU (maps only between workers). A worker's indices are checked
    against what it reports when it joins (``check_worker``).
    """
    if isinstance(device_maps, str):
        device_maps = parse_device_maps(device_maps)
    explicit = _explicit_maps(names, device_maps or {})
    if not gpus and not explicit:
        return {}
    if gpu_count < 1 and not own_gpus:
        asked = "--gpus" if gpus else "a device map"
        raise DeviceMapError(
            f"{asked} needs CUDA, and torch sees no GPU in this process "
            "(torch.cuda.is_available() is False); device maps need CUDA on both ends. "
            "Drop --gpus / --device-map (gpus=, device_maps=) to send CPU tensors, "
            "or run on a machine with a GPU")
    maps: dict[tuple[str, str], dict[int, int]] = {}
    if gpus:
        if own_gpus:
            home = {name: 0 for name in (names if gpu_count else names[1:])}
        else:
            home = {name: k % gpu_count for k, name in enumerate(names)}
        maps = {(a, b): {home[a]: home[b]} for a in home for b in home if a != b}
    for (a, b), m in explicit.items():
        _check_indices(a, b, m, names[0], gpu_count, own_gpus)
        maps[(a, b)] = dict(m)
        if (b, a) not in explicit:
            maps[(b, a)] = {v: k for k, v in m.items()}
    used: dict[str, set[int]] = {name: set() for name in names}
    for (a, b), m in maps.items():
        used[a].update(m.keys())
        used[b].update(m.values())
    # The driver's devices are fixed at its first join (see ``group.driver_group``) and
    # torch checks every map toward it against them: all visible GPUs serve any later map.
    used[names[0]] = set(range(gpu_count))
    return {name: Placement(tuple(sorted(used[name])),
                            {b: maps[(a, b)] for (a, b) in maps if a == name and maps[(a, b)]})
            for name in names}


def _check_indices(a: str, b: str, m: Mapping, driver: str, gpu_count: int, own_gpus: bool) -> None:
    """Raise ``DeviceMapError`` for an index of the map ``a -> b`` that no GPU here has."""
    for name, indices in ((a, m.keys()), (b, m.values())):
        if own_gpus and name != driver:
            continue  # checked against the worker's own GPUs when it joins
        for d in indices:
            if d >= gpu_count:
                raise DeviceMapError(
                    f"device cuda:{d} in the map {a} -> {b} does not exist: torch sees "
                    f"{gpu_count} GPU{'s' * (gpu_count != 1)} here"
                    + (f" (cuda:0 to cuda:{gpu_count - 1}); use one of those indices" if gpu_count else
                       "; a map from or to the driver needs a GPU in the driver's process"))


def reaching_default_workers(driver: Placement, own_gpus: bool = False, count: int = 64) -> Placement:
    """The driver's ``--gpus`` placement plus maps toward ``worker1`` ... ``worker<count>``
    (each on its own ``cuda:0`` with ``own_gpus``, as ``plan`` puts them).

    Its maps are fixed at its first join, so these let a later ``--gpus`` cluster
    with the default names, and more workers than the first, run in the same kernel.
    A map toward a name that is not a member is never used.
    """
    gpu_count = len(driver.devices)
    if not gpu_count:
        return driver
    maps = {f"worker{k}": {0: 0 if own_gpus else k % gpu_count} for k in range(1, count + 1)}
    return Placement(driver.devices, {**maps, **driver.maps})


def check_worker(name: str, where: str, placement: Placement | None, reported: int | None) -> None:
    """Refuse a joining worker whose plan uses GPUs it does not have (``reported``: the
    GPUs torch sees in it; None from a worker that does not say)."""
    if reported is None or not placement or not placement.devices or max(placement.devices) < reported:
        return
    sees = f"sees {reported} GPU{'s' * (reported != 1)}" if reported else "sees no GPU"
    raise DeviceMapError(
        f"{name} on {where} {sees} (torch.cuda.device_count() there), and this cluster puts it "
        f"on {placement.label()}; give each worker a GPU (with --slurm, --gpus asks Slurm for "
        "one per task; some clusters also need a GPU partition: --slurm-args \"-p gpu\"), "
        "or drop --gpus / --device-map (gpus=, device_maps=)")


def visible_gpus() -> int:
    """How many GPUs torch can use in this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def reverse_maps(placements: Mapping[str, Placement], name: str) -> dict[str, dict[int, int]]:
    """The maps ``name`` uses for its replies: each caller's map toward it, inverted."""
    return {caller: {v: k for k, v in p.maps[name].items()}
            for caller, p in placements.items() if caller != name and p.maps.get(name)}


def backend_kwargs(placement: Placement | None) -> dict:
    """``devices`` and ``device_maps`` for ``TensorPipeRpcBackendOptions`` (none on CPU)."""
    if not placement or not placement.devices:
        return {}
    # Device strings: torch reads a bare int as "the current accelerator", which
    # fails before CUDA is initialized in a fresh process.
    return {"devices": [f"cuda:{d}" for d in placement.devices],
            "device_maps": {to: {f"cuda:{a}": f"cuda:{b}" for a, b in m.items()}
                            for to, m in placement.maps.items()}}


def install(devices: list[int], replies: dict[str, dict[int, int]]) -> None:
    """Set this member's agent's devices and reply maps to exactly these.

    Run in every member once a cluster's workers have joined. torch's dynamic
    membership (``_set_devices_and_reverse_device_map`` in ``backend_registry.py``
    and ``TensorPipeAgent::updateGroupMembership``) gets these wrong for a group
    that grows one join at a time:

    - the joiner computes reply maps for itself only (each earlier member's map
      toward it, inverted) and sends that same dict to every member, which
      inserts the entries it lacks: an earlier member never gets the inverse of
      the joiner's map toward it (its replies to the joiner fail with "Response
      device mapping is not available"), and may get another pair's map instead;
    - every leave (``rpc.shutdown`` of a dynamic member) sends ``[]`` and ``{}``,
      which erase every device and every reply map in the members that stay.

    The agent only offers ``torch_compat.update_group_membership``: a leave of a worker that
    does not exist keeps exactly the given devices and reply-map names and erases
    the rest, and a join of this member itself (already known, so nothing else
    changes) inserts the given reply maps and devices.
    """
    import torch
    import torch.distributed.rpc as rpc

    from .._compat import torch_compat

    agent = torch_compat.current_agent()
    cuda = [torch.device("cuda", d) for d in devices]
    nobody = rpc.WorkerInfo("nbrpc:nobody", 32767)
    torch_compat.update_group_membership(agent, nobody, cuda, {}, False)
    maps = {caller: {torch.device("cuda", a): torch.device("cuda", b) for a, b in m.items()}
            for caller, m in replies.items()}
    torch_compat.update_group_membership(agent, agent.get_worker_info(), cuda, maps, True)


def check_driver(joined: Placement, needed: Placement) -> None:
    """Refuse a cluster whose driver needs maps its agent (from its first join) lacks."""
    missing = [f"{to} ({_show(m)})" for to, m in needed.maps.items() if joined.maps.get(to) != m]
    extra = sorted(set(needed.devices) - set(joined.devices))
    if missing or extra:
        what = " and ".join(([f"device maps toward {', '.join(missing)}"] if missing else [])
                            + ([f"devices {', '.join(f'cuda:{d}' for d in extra)}"] if extra else []))
        raise DeviceMapError(
            f"this kernel joined RPC with devices {joined.label()} and device maps "
            f"{_show_all(joined.maps)}, and torch fixes a process's devices and maps at its "
            f"first join; this cluster needs {what}. Restart the kernel and start this "
            "cluster first (or keep the earlier cluster's names and --gpus / --device-map)")


# -- internals -----------------------------------------------------------------------


def _index(text: str, entry: str) -> int:
    match = _INDEX.match(str(text).strip())
    if not match:
        raise DeviceMapError(
            f"cannot read device {str(text).strip()!r} in device map {entry!r}: give a GPU "
            f"index such as 0 or cuda:0, {_EXAMPLE}")
    return int(match.group(1))


def _explicit_maps(names: list[str], device_maps: Mapping) -> dict[tuple[str, str], dict[int, int]]:
    """``device_maps`` as ``{(source, target): {from: to}}``, validated."""
    if not isinstance(device_maps, Mapping):
        raise DeviceMapError(f"device_maps must be a dict like {{'worker1': {{0: 1}}}}, got {device_maps!r}")
    driver, known = names[0], ", ".join(names)
    out: dict[tuple[str, str], dict[int, int]] = {}
    for key, m in device_maps.items():
        source, _, target = str(key).rpartition(ARROW)
        source, target = (source.strip() or driver), target.strip()
        for name in (source, target):
            if name not in names:
                raise DeviceMapError(
                    f"the device map {key!r} names {name!r}, which is not a member of this "
                    f"cluster ({known}); map to one of those names")
        if source == target:
            raise DeviceMapError(f"the device map {key!r} maps {source!r} to itself; "
                                 "a map goes from one member to another")
        if not isinstance(m, Mapping) or not m:
            raise DeviceMapError(f"the device map for {key!r} must be a non-empty dict "
                                 f"{{from: to}} of GPU indices, got {m!r}")
        pairs = {_index(a, key): _index(b, key) for a, b in m.items()}
        if len(pairs) != len(m):
            raise DeviceMapError(f"the device map for {key!r} lists a device twice: {m!r}")
        seen: dict[int, int] = {}
        for a, b in pairs.items():
            if b in seen:
                raise DeviceMapError(
                    f"the device map {source} -> {target} sends both cuda:{seen[b]} and "
                    f"cuda:{a} to cuda:{b}; a device map must be one-to-one (torch inverts it "
                    "for replies): give each target device once")
            seen[b] = a
        if (source, target) in out:
            raise DeviceMapError(f"two device maps for {source} -> {target}; merge them into one")
        out[(source, target)] = pairs
    return out


def _not_one_to_one_from(key: str, a: int, b: int, c: int) -> str:
    return (f"the device map {key!r} sends cuda:{a} to both cuda:{b} and cuda:{c}; a device "
            "map must be one-to-one (torch inverts it for replies): give each device once")


def _show(m: Mapping[int, int]) -> str:
    return ", ".join(f"cuda:{a} -> cuda:{b}" for a, b in m.items())


def _show_all(maps: Mapping[str, Mapping[int, int]]) -> str:
    return "; ".join(f"{to}: {_show(m)}" for to, m in maps.items()) or "none"
