"""A worker's settings: one record, the same through the environment and the grant."""

from __future__ import annotations

import dataclasses
import json

import pytest

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
