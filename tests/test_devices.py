"""GPU devices and device maps: the plan (pure, with pretend GPU counts), its checks,
how it reaches torch's options and the workers, and the refusals on this machine.

The paths that need CUDA run in ``test_cuda.py`` (marked ``gpu``)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import worker_pids

import nbrpc
from nbrpc.errors import DeviceMapError
from nbrpc.group import devices, membership
from nbrpc.group.devices import Placement

MEMBERS = ["master", "worker1", "worker2"]


def assert_consistent(placements: dict[str, Placement], gpu_count: int) -> None:
    """What torch needs of every pair: inverse maps both ways, devices that cover them."""
    for a, b in itertools.permutations(placements, 2):
        forward = placements[a].maps.get(b, {})
        back = placements[b].maps.get(a, {})
        if forward:
            assert back == {v: k for k, v in forward.items()}, (a, b)
            assert len(set(forward.values())) == len(forward)  # one-to-one
            assert set(forward) <= set(placements[a].devices)
            assert set(forward.values()) <= set(placements[b].devices)
    for p in placements.values():
        assert all(0 <= d < gpu_count for d in p.devices)
        assert list(p.devices) == sorted(set(p.devices))


# -- the plan ----------------------------------------------------------------------


def test_no_gpu_options_is_cpu_everywhere():
    assert devices.plan(MEMBERS, 0) == {}
    assert devices.plan(MEMBERS, 4, gpus=False, device_maps=None) == {}
    assert devices.plan(MEMBERS, 4, device_maps={}) == {}


@pytest.mark.parametrize("gpu_count", [1, 2, 3, 4])
def test_gpus_round_robin_with_maps_between_every_pair(gpu_count):
    names = ["master", "worker1", "worker2", "worker3"]
    plan = devices.plan(names, gpu_count, gpus=True)
    home = {name: k % gpu_count for k, name in enumerate(names)}
    assert home["master"] == 0
    assert plan["master"].devices == tuple(range(gpu_count))  # the driver: every visible GPU
    for name in names[1:]:
        assert plan[name].devices == (home[name],)
    for a, b in itertools.permutations(names, 2):
        assert plan[a].maps[b] == {home[a]: home[b]}
    assert_consistent(plan, gpu_count)


def test_two_gpus_two_workers_as_in_the_recipe():
    plan = devices.plan(MEMBERS, 2, gpus=True)
    assert plan["worker1"] == Placement((1,), {"master": {1: 0}, "worker2": {1: 0}})
    assert plan["worker2"] == Placement((0,), {"master": {0: 0}, "worker1": {0: 1}})
    assert plan["master"].maps == {"worker1": {0: 1}, "worker2": {0: 0}}
    assert plan["worker1"].label() == "cuda:1" and plan["master"].label() == "cuda:0,cuda:1"


def test_explicit_map_from_the_driver_brings_its_inverse():
    plan = devices.plan(MEMBERS, 2, device_maps={"worker1": {0: 1, 1: 0}})
    assert plan["master"].maps == {"worker1": {0: 1, 1: 0}}
    assert plan["worker1"] == Placement((0, 1), {"master": {1: 0, 0: 1}})
    assert plan["worker2"] == devices.CPU and plan["worker2"].label() == "cpu"
    assert_consistent(plan, 2)


def test_worker_to_worker_map_and_an_explicit_reverse_kept():
    plan = devices.plan(MEMBERS, 4, device_maps={
        "worker1->worker2": {1: 2}, "worker2->worker1": {3: 1}, "worker1": {0: 1}})
    assert plan["worker1"].maps == {"worker2": {1: 2}, "master": {1: 0}}
    assert plan["worker2"].maps == {"worker1": {3: 1}}
    assert plan["worker1"].devices == (1,) and plan["worker2"].devices == (2, 3)
    assert plan["master"].devices == (0, 1, 2, 3)


def test_explicit_maps_replace_what_gpus_derived_for_their_pair():
    plan = devices.plan(MEMBERS, 2, gpus=True, device_maps="worker2=1:1")
    assert plan["master"].maps == {"worker1": {0: 1}, "worker2": {1: 1}}
    assert plan["worker2"].maps == {"master": {1: 1}, "worker1": {0: 1}}
    assert plan["worker2"].devices == (0, 1)
    assert_consistent(plan, 2)


@pytest.mark.parametrize("driver_gpus", [0, 1, 4])
def test_workers_with_their_own_gpus_are_each_on_their_own_cuda0(driver_gpus):
    """A Slurm task sees the GPU Slurm gave it as cuda:0, whatever the driver's machine has."""
    plan = devices.plan(MEMBERS, driver_gpus, gpus=True, own_gpus=True)
    assert plan["worker1"].devices == plan["worker2"].devices == (0,)
    assert plan["worker1"].maps["worker2"] == plan["worker2"].maps["worker1"] == {0: 0}
    assert plan["master"].devices == tuple(range(driver_gpus))
    if driver_gpus:
        assert plan["master"].maps == {"worker1": {0: 0}, "worker2": {0: 0}}
        assert plan["worker1"].maps["master"] == {0: 0}
    else:  # a login node: the driver sends CPU tensors, the workers map to each other
        assert plan["master"].maps == {} and "master" not in plan["worker1"].maps
        assert devices.reaching_default_workers(plan["master"], own_gpus=True) == plan["master"]
    assert devices.reverse_maps(plan, "worker1")["worker2"] == {0: 0}


def test_own_gpus_checks_the_drivers_indices_now_and_the_workers_at_their_join():
    plan = devices.plan(MEMBERS, 1, device_maps="worker1=0:3;worker1->worker2=2:5", own_gpus=True)
    assert plan["worker1"].devices == (2, 3) and plan["worker2"].devices == (5,)
    with pytest.raises(DeviceMapError, match=r"device cuda:1 in the map master -> worker1 does not exist"):
        devices.plan(MEMBERS, 1, device_maps="worker1=1:0", own_gpus=True)
    with pytest.raises(DeviceMapError, match="a map from or to the driver needs a GPU in the driver's process"):
        devices.plan(MEMBERS, 0, device_maps="worker1=0:0", own_gpus=True)
    devices.check_worker("worker1", "node7 (10.0.0.7)", plan["worker1"], 4)  # cuda:0..3: enough
    devices.check_worker("worker1", "node7 (10.0.0.7)", plan["worker1"], None)  # says nothing: torch will
    devices.check_worker("worker3", "node7 (10.0.0.7)", None, 0)  # on CPU
    with pytest.raises(DeviceMapError) as info:
        devices.check_worker("worker2", "node8 (10.0.0.8)", plan["worker2"], 1)
    assert str(info.value).startswith("worker2 on node8 (10.0.0.8) sees 1 GPU (torch.cuda.device_count() "
                                      "there), and this cluster puts it on cuda:5")
    with pytest.raises(DeviceMapError, match=r"worker1 on node7 \(10.0.0.7\) sees no GPU .* --gpus asks Slurm"):
        devices.check_worker("worker1", "node7 (10.0.0.7)", plan["worker1"], 0)


def test_device_strings_and_the_text_form_mean_the_same():
    a = devices.plan(MEMBERS, 2, device_maps={"worker1": {"cuda:0": "cuda:1"}})
    b = devices.plan(MEMBERS, 2, device_maps="worker1=0:1")
    c = devices.plan(MEMBERS, 2, device_maps={"master->worker1": {0: 1}})
    assert a == b == c


def test_reverse_maps_are_each_callers_map_inverted():
    plan = devices.plan(MEMBERS, 2, gpus=True)
    assert devices.reverse_maps(plan, "worker1") == {"master": {1: 0}, "worker2": {1: 0}}
    assert devices.reverse_maps(plan, "master") == {"worker1": {0: 1}, "worker2": {0: 0}}
    assert devices.reverse_maps({}, "master") == {}


# -- the text form -----------------------------------------------------------------


def test_parse_one_several_and_repeated_targets():
    assert devices.parse_device_maps("worker1=0:1") == {"worker1": {0: 1}}
    assert devices.parse_device_maps(" worker1 = 0:1 , 1:0 ; worker2=0:0 ;") == {
        "worker1": {0: 1, 1: 0}, "worker2": {0: 0}}
    assert devices.parse_device_maps("worker1->worker2=1:0;worker1=0:1;worker1=1:0") == {
        "worker1->worker2": {1: 0}, "worker1": {0: 1, 1: 0}}


@pytest.mark.parametrize("text, says", [
    ("", "empty device map"),
    ("worker1", "cannot read device map 'worker1'"),
    ("worker1=", "cannot read device map"),
    ("=0:1", "cannot read device map"),
    ("worker1=0", "cannot read '0'"),
    ("worker1=0-1", "cannot read '0-1'"),
    ("worker1=a:1", "cannot read device 'a'"),
    ("worker1=0:-1", "cannot read device '-1'"),
    ("worker1=0:1,0:2", "sends cuda:0 to both cuda:1 and cuda:2"),
])
def test_malformed_text_says_what_to_write(text, says):
    with pytest.raises(DeviceMapError) as info:
        devices.parse_device_maps(text)
    message = str(info.value)
    assert says in message
    assert "worker1=0:1" in message or "one-to-one" in message  # an example, or the rule


# -- refusals ----------------------------------------------------------------------


@pytest.mark.parametrize("options", [dict(gpus=True), dict(device_maps={"worker1": {0: 0}}),
                                     dict(device_maps="worker1=0:0")])
def test_no_cuda_is_refused_with_the_way_out(options):
    with pytest.raises(DeviceMapError) as info:
        devices.plan(MEMBERS, 0, **options)
    message = str(info.value)
    assert "needs CUDA" in message and "torch.cuda.is_available() is False" in message
    assert "Drop --gpus / --device-map" in message


@pytest.mark.parametrize("maps, device", [({"worker1": {0: 2}}, "cuda:2"), ({"worker1": {5: 0}}, "cuda:5"),
                                          ({"worker1->worker2": {1: 2}}, "cuda:2")])
def test_a_device_that_does_not_exist(maps, device):
    with pytest.raises(DeviceMapError) as info:
        devices.plan(MEMBERS, 2, device_maps=maps)
    assert f"device {device} in the map" in str(info.value)
    assert "torch sees 2 GPUs here (cuda:0 to cuda:1)" in str(info.value)


@pytest.mark.parametrize("key, name", [("worker9", "worker9"), ("ps->worker1", "ps"), ("worker1->boss", "boss")])
def test_a_map_to_an_unknown_member(key, name):
    with pytest.raises(DeviceMapError) as info:
        devices.plan(MEMBERS, 2, device_maps={key: {0: 1}})
    assert f"names {name!r}, which is not a member of this cluster (master, worker1, worker2)" in str(info.value)


def test_maps_that_are_not_one_to_one():
    with pytest.raises(DeviceMapError, match="sends both cuda:0 and cuda:1 to cuda:1; a device map must be one-to-one"):
        devices.plan(MEMBERS, 2, device_maps={"worker1": {0: 1, 1: 1}})
    with pytest.raises(DeviceMapError, match="lists a device twice"):
        devices.plan(MEMBERS, 2, device_maps={"worker1": {0: 1, "cuda:0": 1}})
    with pytest.raises(DeviceMapError, match="two device maps for master -> worker1"):
        devices.plan(MEMBERS, 2, device_maps={"worker1": {0: 1}, "master->worker1": {1: 0}})


def test_other_shapes_refused():
    with pytest.raises(DeviceMapError, match="maps 'worker1' to itself"):
        devices.plan(MEMBERS, 2, device_maps={"worker1->worker1": {0: 1}})
    with pytest.raises(DeviceMapError, match="must be a non-empty dict"):
        devices.plan(MEMBERS, 2, device_maps={"worker1": {}})
    with pytest.raises(DeviceMapError, match="device_maps must be a dict"):
        devices.plan(MEMBERS, 2, device_maps=[("worker1", {0: 1})])
    assert issubclass(DeviceMapError, ValueError)


def test_a_later_cluster_needing_other_maps_names_the_restart():
    first = devices.plan(MEMBERS, 2, gpus=True)["master"]
    devices.check_driver(first, devices.plan(MEMBERS, 2, gpus=True)["master"])  # the same: fine
    devices.check_driver(first, devices.plan(MEMBERS[:2], 2, gpus=True)["master"])  # fewer: fine
    devices.check_driver(first, devices.CPU)
    with pytest.raises(DeviceMapError) as info:
        devices.check_driver(first, devices.plan(["master", "worker1", "worker3"], 2, gpus=True)["master"])
    message = str(info.value)
    assert "device maps toward worker3 (cuda:0 -> cuda:0)" in message
    assert "Restart the kernel and start this cluster first" in message
    with pytest.raises(DeviceMapError, match=r"\(cuda:0 -> cuda:0\) and devices cuda:0, cuda:1. Restart the kernel"):
        devices.check_driver(devices.CPU, first)


def test_a_first_gpus_cluster_lets_later_ones_grow():
    first = devices.reaching_default_workers(devices.plan(MEMBERS, 2, gpus=True)["master"])
    assert first.devices == (0, 1) and len(first.maps) == 64 and first.maps["worker7"] == {0: 1}
    later = devices.plan(["master", *(f"worker{k}" for k in range(1, 6))], 2, gpus=True)["master"]
    devices.check_driver(first, later)
    mapped = devices.plan(MEMBERS, 2, device_maps="worker1=1:1")["master"]
    assert devices.reaching_default_workers(mapped).maps["worker1"] == {1: 1}  # its own maps win


# -- to torch and to the workers ---------------------------------------------------


def test_backend_options_carry_devices_and_maps():
    plan = devices.plan(MEMBERS, 2, gpus=True)
    options = membership.backend_options(4, 30.0, plan["worker1"])
    cuda = lambda i: torch.device("cuda", i)  # noqa: E731
    assert options.devices == [cuda(1)]
    assert options.device_maps == {"master": {cuda(1): cuda(0)}, "worker2": {cuda(1): cuda(0)}}
    cpu = membership.backend_options(4, 30.0, devices.CPU)
    assert cpu.devices == [] and cpu.device_maps == {}
    assert membership.backend_options(4, 30.0).devices == []


def test_worker_settings_round_trip():
    plan = devices.plan(MEMBERS, 4, gpus=True, device_maps="worker1->worker2=1:3")
    for name in MEMBERS:
        assert Placement.from_json(plan[name].to_json()) == plan[name]
    assert devices.CPU.to_json() is None and Placement.from_json(None) is None


def test_cluster_worker_env_holds_each_workers_part(cluster, monkeypatch):
    from nbrpc.launchers.local import LocalWorker as Worker
    from nbrpc.settings import WorkerSettings

    assert "NBRPC_DEVICES" not in cluster._settings(Worker("worker2", 2)).to_env()
    # The plan of a pretend machine with 2 GPUs, as a cluster there would hold it.
    monkeypatch.setattr(cluster, "placements", devices.plan(MEMBERS, 2, gpus=True))
    env = cluster._settings(Worker("worker2", 2)).to_env()
    assert WorkerSettings.from_env(env).placement == cluster.placements["worker2"]


# -- this machine (no CUDA): refused before any process starts ---------------------


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@needs_no_cuda
@pytest.mark.parametrize("options", [dict(gpus=True), dict(device_maps={"worker1": {0: 1}})])
def test_cluster_refuses_gpu_options_without_cuda(options):
    before, joined, running = worker_pids(), membership.GROUP.driver, nbrpc.current()
    with pytest.raises(DeviceMapError, match="needs CUDA"):
        nbrpc.Cluster(2, progress=None, **options)
    with pytest.raises(DeviceMapError, match="needs CUDA"):
        nbrpc.start(2, progress=None, **options)
    assert worker_pids() == before and membership.GROUP.driver is joined and nbrpc.current() is running


def test_cluster_refuses_an_unknown_worker_first():
    with pytest.raises(DeviceMapError, match="names 'worker3', which is not a member"):
        nbrpc.Cluster(2, progress=None, device_maps={"worker3": {0: 0}})
    with pytest.raises(DeviceMapError, match="names 'trainer'"):
        nbrpc.Cluster(progress=None, attach=1, device_maps="trainer=0:0")


# -- a real CPU cluster: status, and the reply-map repair leaves it working --------


def test_status_rows_say_cpu(cluster):
    rows = cluster.status()
    assert [r["devices"] for r in rows] == ["cpu", "cpu", "cpu"]


def test_install_keeps_membership_and_calls_working(cluster):
    # A CPU member can hold CUDA reply maps (used only for CUDA tensors); devices
    # stay empty here since the agent would make CUDA streams for them.
    replies = {"master": {1: 0}, "worker2": {1: 0}}
    rpc.rpc_sync("worker1", devices.install, args=([], replies))
    devices.install([], {"worker1": {0: 1}})
    assert sorted(membership.member_names()) == ["master", "worker1", "worker2"]
    assert sorted(rpc.rpc_sync("worker1", membership.member_names)) == ["master", "worker1", "worker2"]
    x = torch.arange(4.0)
    assert torch.equal(rpc.rpc_sync("worker1", torch.add, args=(x, 1)), x + 1)
    assert torch.equal(rpc.rpc_sync("worker2", torch.mul, args=(x, 2)), x * 2)
    cluster.install_devices()  # a CPU cluster has nothing to install
