"""A member that joined through nbrpc has what ``init_rpc`` leaves in a script.

The same functions run in a plain torch script of two processes (``init_rpc``, a
dynamic group of master and worker1) and in an nbrpc driver script with one worker:
the state of each member, torch's profilers around RPC calls (remote events
included), and torch's ``_server_process_global_profile`` docstring example, run
from a cell on worker1. Each pair must be equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import DRIVER_START, free_port

pytestmark = pytest.mark.slow

# What each member reports, in the script and in the cluster alike.
PROBES = '''
import json, os, sys, time
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.autograd import profiler_legacy
from torch.distributed.rpc import api


def member_state():
    """What init_rpc leaves in this process, as JSON values."""
    agent = api._get_current_rpc_agent()
    opts = agent._get_backend_options()
    one = torch.ones(1)
    with rpc._server_process_global_profile() as prof:  # this member's RPC threads
        rpc.rpc_sync(rpc.get_worker_info(), torch.add, args=(one, one))
    with dist_autograd.context() as context_id:
        autograd_worker_id = context_id >> 48
    rref = rpc.RRef(7)
    me = rpc.get_worker_info()
    return {
        "profiler_node_ids": sorted({e.node_id for e in prof.function_events}),
        "agent": type(agent).__name__,
        "agent_set": api._is_current_rpc_agent_set(),
        "static_group": agent.is_static_group,
        "me": [me.name, me.id],
        "workers": sorted([i.name, i.id] for i in agent.get_worker_infos()),
        "all_worker_names": sorted(api._ALL_WORKER_NAMES),
        "options": [opts.num_worker_threads, opts.rpc_timeout, [str(d) for d in opts.devices],
                    {k: {str(a): str(b) for a, b in m.items()} for k, m in opts.device_maps.items()}],
        "default_timeout": rpc.get_rpc_timeout(),
        "autograd_worker_id": autograd_worker_id,
        "rref": [rref.owner().name, rref.is_owner(), rref.to_here()],
        "rref_context": sorted(rpc._rref_context_get_debug_info()),
        "init_counter": rpc._init_counter,
        "process_group": torch.distributed.is_initialized(),
    }


def rpc_events(events):
    return sorted([e.name, e.node_id, [list(s) for s in e.input_shapes]]
                  for e in events if "->" in e.name or "#remote_op" in e.name)


def profiled(peer):
    """torch's profilers around calls to peer: name, node id and shapes of each RPC event."""
    x, y = torch.ones(2, 3), torch.ones(2, 3)

    def calls(remote_events=False):
        rpc.rpc_sync(peer, torch.add, args=(x, y))
        rpc.rpc_async(peer, torch.mul, args=(x, y)).wait()
        rref = rpc.remote(peer, torch.sub, args=(x, y))
        rref.to_here()
        if remote_events:
            # the remote's events come with the owner's confirmation, which may follow
            # to_here's reply (torch's own tests wait for it so)
            rref._get_profiling_future().wait()

    found = {}
    with profiler_legacy.profile(record_shapes=True) as prof:  # the one with remote events
        calls(remote_events=True)
    found["legacy"] = rpc_events(prof.function_events)
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        calls()
    found["autograd"] = rpc_events(prof.function_events)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        calls()
    found["profiler"] = rpc_events(prof.events())
    return found


def server_profiled(peer):
    """torch's _server_process_global_profile docstring example, toward peer.

    Under load torch's own example now and then loses the outer profile's add (seen
    once in a plain script on a busy 2-core machine): it runs until it gives what the
    docstring shows, three times at most, the same on either side.
    """
    for _ in range(3):
        found = server_profile_example(peer)
        if [key for key, _, _ in found["outer"]] == ["aten::add", "aten::sub"]:
            break
    return found


def server_profile_example(peer):
    from torch.distributed.rpc import _server_process_global_profile
    x, y = torch.tensor(1), torch.tensor(2)
    outer = rpc.remote(peer, _server_process_global_profile)
    outer.rpc_sync().__enter__()
    rpc.rpc_sync(peer, torch.add, (x, y))
    inner = rpc.remote(peer, _server_process_global_profile)
    inner.rpc_sync().__enter__()
    rpc.rpc_sync(peer, torch.sub, (x, y))
    inner.rpc_sync().__exit__(None, None, None)
    outer.rpc_sync().__exit__(None, None, None)
    return {label: sorted([a.key, a.node_id, a.count] for a in rref.rpc_sync().key_averages())
            for label, rref in (("inner", inner), ("outer", outer))}
'''

# One process of the plain script: rank, port, and two flag files (master's calls
# are done; worker1's are).
SCRIPT = PROBES + '''
rank, port, master_done, worker_done = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
names = ["master", "worker1"]
opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60,
                                       init_method=f"tcp://127.0.0.1:{port}", _transports=["uv"])
rpc.init_rpc(names[rank], rank=rank, rpc_backend_options=opts)


def wait_for(path):
    while not os.path.exists(path):
        time.sleep(0.05)


if rank == 0:
    while len(api._get_current_rpc_agent().get_worker_infos()) < 2:
        time.sleep(0.05)
    found = {"state": member_state(), "profiled": profiled("worker1"), "server": server_profiled("worker1")}
    open(master_done, "w").close()
    wait_for(worker_done)
    print(json.dumps({"master": found}), flush=True)
    while len(api._get_current_rpc_agent().get_worker_infos()) > 1:  # worker1 left
        time.sleep(0.05)
else:
    wait_for(master_done)
    found = {"state": member_state(), "server": server_profiled("master")}
    print(json.dumps({"worker1": found}), flush=True)
    open(worker_done, "w").close()
rpc.shutdown()
'''

# The same in an nbrpc driver script; worker1 runs its part as a cell.
DRIVER = PROBES + '''
import nbrpc

cluster = nbrpc.start(1, progress=None, threads=16, timeout=60)
found = {"state": member_state(), "profiled": profiled("worker1"), "server": server_profiled("worker1")}
print(json.dumps({"master": found}), flush=True)
cluster.run(PROBES + "\\nworker_found = {'state': member_state(), 'server': server_profiled('master')}",
            "worker1")


def fetch():
    return worker_found


print(json.dumps({"worker1": rpc.rpc_sync("worker1", fetch)}), flush=True)
cluster.shutdown()
'''


def script_results(tmp_path, pids) -> dict:
    """Run the plain torch script's two processes; what each printed."""
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    flags = [str(tmp_path / "master.done"), str(tmp_path / "worker1.done")]
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(path), str(rank), port, *flags], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    pids.add(*(p.pid for p in procs))
    found = {}
    for proc in procs:
        out, err = proc.communicate(timeout=DRIVER_START)
        assert proc.returncode == 0, err[-3000:]
        found.update(json.loads(out.strip().splitlines()[-1]))
    return found


def test_a_member_has_what_init_rpc_leaves_and_profiles_as_in_a_script(tmp_path, pids, drivers):
    script = script_results(tmp_path, pids)
    driver = drivers(textwrap.dedent(DRIVER).replace("PROBES + ", f"{PROBES!r} + "))
    cluster = {**driver.expect("master", DRIVER_START), **driver.expect("worker1", DRIVER_START)}
    assert driver.proc.wait(timeout=60) == 0

    for member, rank in (("master", 0), ("worker1", 1)):
        state = script[member]["state"]
        # what the script shows: the member's rank as its profiler node id, its
        # autograd worker id and its agent's id, both members known
        assert state["profiler_node_ids"] == [rank] and state["autograd_worker_id"] == rank
        assert state["me"] == [member, rank] and state["workers"] == [["master", 0], ["worker1", 1]]
        assert cluster[member]["state"] == state, member
        assert cluster[member]["server"] == script[member]["server"], member
    # remote events came back with worker1's node id, named as in the script
    legacy = script["master"]["profiled"]["legacy"]
    assert any(node == 1 and "#remote_op: aten::add" in name for name, node, _ in legacy), legacy
    assert cluster["master"]["profiled"] == script["master"]["profiled"]
    # the docstring example gives what its docstring shows, its events with the
    # server's rank, not -1
    assert script["worker1"]["server"] == {"inner": [["aten::sub", 0, 1]],
                                           "outer": [["aten::add", 0, 1], ["aten::sub", 0, 1]]}
