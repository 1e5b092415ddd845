"""A worker's settings: one record, the same through the environment and the grant."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nbrpc import settings
from nbrpc.group.devices import Placement
from nbrpc.settings import WorkerSettings, check_name

SETTINGS = WorkerSettings(
    name="worker1", rank=3, prefix="nbrpc-abc", key=b"\x01" * 32, threads=8, timeout=12.5,
    track=False, trace=True, transport="shm", placement=Placement((1,), {"master": {1: 0}}),
    store="127.0.0.1:4000", driver_pid=1234, interface="lo", env={"EXTRA": "yes"},
)


def test_environment_round_trip():
    env = SETTINGS.to_env()
    assert env["EXTRA"] == "yes"
    assert WorkerSettings.from_env(env) == dataclasses.replace(SETTINGS, env={})


def test_grant_leaves_out_the_drivers_machine():
    wire = json.loads(json.dumps(SETTINGS.to_wire()))  # what the rendezvous carries
    assert not {"NBRPC_STORE", "NBRPC_DRIVER_PID", "NBRPC_INTERFACE"} & set(wire)
    got = WorkerSettings.from_wire(wire, "127.0.0.1:5000", None)
    assert (got.store, got.interface, got.driver_pid) == ("127.0.0.1:5000", None, None)
    assert (got.name, got.rank, got.key, got.placement, got.track, got.trace) == (
        "worker1", 3, SETTINGS.key, SETTINGS.placement, False, True)
    assert got.env == {"EXTRA": "yes"}


def test_a_cpu_worker_has_no_devices():
    cpu = WorkerSettings("w", 1, "p", b"k", 1, 1.0)
    assert "NBRPC_DEVICES" not in cpu.to_env() and WorkerSettings.from_env(cpu.to_env()).placement is None


@pytest.mark.parametrize("name", ["worker one", "w/1", "", "x" * 128, 3])
def test_check_name_refuses(name):
    with pytest.raises(ValueError, match="invalid worker name"):
        check_name(name)


# -- the variables people set: read here alone ----------------------------------------


def test_the_readers_of_what_people_set(monkeypatch):
    for variable in ("NBRPC_TOKEN", "NBRPC_LAUNCHER", "NBRPC_NAME", "NBRPC_CLOCK_SKEW", "NBRPC_WARM_START"):
        monkeypatch.delenv(variable, raising=False)
    assert (settings.join_token(), settings.default_launcher(), settings.in_a_worker()) == ("", "", False)
    assert (settings.clock_skew(), settings.warm_start_wanted()) == (0.0, True)
    monkeypatch.setenv("NBRPC_TOKEN", "t0k")
    monkeypatch.setenv("NBRPC_LAUNCHER", " slurm ")
    monkeypatch.setenv("NBRPC_NAME", "worker1")
    monkeypatch.setenv("NBRPC_CLOCK_SKEW", "-3.5")
    monkeypatch.setenv("NBRPC_WARM_START", "off")
    assert (settings.join_token(), settings.default_launcher(), settings.in_a_worker()) == ("t0k", "slurm", True)
    assert (settings.clock_skew(), settings.warm_start_wanted()) == (-3.5, False)
    monkeypatch.setenv("NBRPC_CLOCK_SKEW", "soon")
    with pytest.raises(ValueError, match="NBRPC_CLOCK_SKEW='soon' is not a number of seconds"):
        settings.clock_skew()


def test_the_limits_asked_by_an_administrator():
    named, texts = settings.limits_asked({"NBRPC_LIMITS": "/etc/x.toml", "NBRPC_MAX_WORKERS": " 6 ",
                                          "NBRPC_MAX_TIMEOUT": "", "OTHER": "1"})
    assert (named, texts) == ("/etc/x.toml", {"max_workers": "6"})
    assert settings.limits_asked({}) == ("", {})


def test_a_local_workers_clock_skew_comes_from_its_environment():
    """What a test on one host uses to stand for another machine's clock (``clocks``)."""
    import torch.distributed.rpc as rpc

    import nbrpc
    from nbrpc.recording import clocks

    cluster = nbrpc.start(1, progress=None, timeout=30, env={"NBRPC_CLOCK_SKEW": "2.5"})
    try:
        assert rpc.rpc_sync("worker1", clocks.clock_id).endswith("+2.5")
        assert clocks.clock_id() == rpc.rpc_sync("worker1", clocks.clock_id).rsplit("+", 1)[0]  # the driver's own
    finally:
        cluster.shutdown()
