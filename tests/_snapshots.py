"""Snapshots in the schemas of ``nbrpc.schemas`` (the RRef and autograd snapshots of docs/guide/views.md),
for the widget tests (and a browser's kernel)."""

from __future__ import annotations

RREF = {
    "workers": [{"name": "master", "id": 0, "host": "127.0.0.1", "pid": 4242},
                {"name": "p1", "id": 1, "host": "127.0.0.1", "pid": 4243},
                {"name": "p2", "id": 2, "host": "127.0.0.1", "pid": 4244}],
    "rrefs": [
        {"id": "0:1", "owner": "p1", "creator": "master", "holders": ["master"], "type": "Tensor",
         "summary": "Tensor[2, 3] float32", "size": 24,
         "call_site": 'cell line 2: ra = rpc.remote("p1", load_a)', "confirmed": True},
        {"id": "0:2", "owner": "p1", "creator": "master", "holders": ["master", "p2"], "type": "Net",
         "summary": "Net (20 parameters)", "size": 80, "call_site": None, "confirmed": True},
        {"id": "0:10", "owner": "p2", "creator": "master", "holders": ["master"], "type": None,
         "summary": None, "size": None, "call_site": None, "confirmed": False},
    ],
    "events": [
        {"t": 1763856000.1, "kind": "create", "rref": "0:1", "from": "master", "to": "p1"},
        {"t": 1763856000.2, "kind": "create", "rref": "0:2", "from": "master", "to": "p1"},
        {"t": 1763856000.3, "kind": "fork", "rref": "0:2", "from": "master", "to": "p2"},
        {"t": 1763856000.4, "kind": "fetch", "rref": "0:1", "from": "p1", "to": "master"},
        {"t": 1763856000.5, "kind": "create", "rref": "0:10", "from": "master", "to": "p2"},
        {"t": 1763856000.6, "kind": "fork", "rref": "0:9", "from": "master", "to": "p2"},
    ],
}

AUTOGRAD = {
    "context_id": 7, "workers": ["master", "w1"],
    "nodes": [
        {"id": "master:0", "worker": "master", "name": "SumBackward0"},
        {"id": "master:1", "worker": "master", "name": "RecvRpcBackward"},
        {"id": "master:2", "worker": "master", "name": "AccumulateGrad", "param": "x"},
        {"id": "master:3", "worker": "master", "name": "SendRpcBackward"},
        {"id": "w1:0", "worker": "w1", "name": "SendRpcBackward"},
        {"id": "w1:1", "worker": "w1", "name": "AddmmBackward0"},
        {"id": "w1:2", "worker": "w1", "name": "AccumulateGrad", "param": "fc1.weight"},
        {"id": "w1:3", "worker": "w1", "name": "AccumulateGrad", "param": "fc1.bias"},
        {"id": "w1:4", "worker": "w1", "name": "RecvRpcBackward"},
    ],
    "edges": [
        {"src": "master:0", "dst": "master:1", "kind": "local"},
        {"src": "master:1", "dst": "w1:0", "kind": "rpc"},
        {"src": "w1:0", "dst": "w1:1", "kind": "local"},
        {"src": "w1:1", "dst": "w1:2", "kind": "local"},
        {"src": "w1:1", "dst": "w1:3", "kind": "local"},
        {"src": "w1:1", "dst": "w1:4", "kind": "local"},
        {"src": "w1:4", "dst": "master:3", "kind": "rpc"},
        {"src": "master:3", "dst": "master:2", "kind": "local"},
    ],
    "gradients": [{"worker": "w1", "param": "fc1.weight", "shape": [4, 3], "norm": 0.53},
                  {"worker": "w1", "param": "fc1.bias", "shape": [4], "norm": 0.21}],
}


def synthetic(rrefs: int = 1000, workers: int = 8) -> dict:
    """A snapshot of ``rrefs`` RRefs owned round-robin by ``workers - 1`` workers."""
    names = ["master"] + [f"w{i}" for i in range(1, workers)]
    snapshot = {"workers": [{"name": n, "id": i, "host": "127.0.0.1", "pid": 1000 + i}
                            for i, n in enumerate(names)], "rrefs": [], "events": []}
    for k in range(rrefs):
        owner = names[1 + k % (workers - 1)]
        holders = ["master"] + ([names[1 + (k + 1) % (workers - 1)]] if k % 3 == 0 else [])
        rid = f"0:{k + 1}"
        snapshot["rrefs"].append({
            "id": rid, "owner": owner, "creator": "master", "holders": holders, "type": "Tensor",
            "summary": f"Tensor[{k % 7 + 1}, 4] float32", "size": (k % 7 + 1) * 16,
            "call_site": f"cell line {k % 5 + 1}: r = rpc.remote({owner!r}, f)", "confirmed": k % 10 != 0})
        snapshot["events"].append({"t": 1763856000 + k / 100, "kind": "create", "rref": rid,
                                   "from": "master", "to": owner})
        if len(holders) > 1:
            snapshot["events"].append({"t": 1763856000 + k / 100 + 0.001, "kind": "fork", "rref": rid,
                                       "from": "master", "to": holders[1]})
    return snapshot


def _call(n, caller, callee, name, sent, began, ended, replied, *, kind="rpc_sync", thread="t1",
          parent=None, error=None, tensor=0):
    return {"id": f"{caller}:{n}", "caller": caller, "callee": callee, "kind": kind, "name": name,
            "sent": sent, "began": began, "ended": ended, "replied": replied, "thread": thread,
            "request": {"tensor": tensor, "pickle": 100}, "reply": {"tensor": tensor, "pickle": 50},
            "parent": parent, "context": None, "rref": None, "error": error}


# A pipeline's trace, times in seconds from 100.0 on the driver's clock: master sends
# two micro-batches to stage1 (w1) then stage2 (w2); stage2's first call overlaps
# stage1's second one by 0.02 s; w2 fetches from w1 inside a call (nesting); one call
# fails; one call's callee part is missing.
TRACE = {
    "workers": [{"name": "master", "id": 0, "host": "127.0.0.1", "pid": 4242},
                {"name": "w1", "id": 1, "host": "127.0.0.1", "pid": 4243},
                {"name": "w2", "id": 2, "host": "127.0.0.1", "pid": 4244}],
    "calls": [
        _call(1, "master", "w1", "stage1", 100.00, 100.01, 100.05, 100.06, kind="rpc_async", tensor=4096),
        _call(2, "master", "w1", "stage1", 100.01, 100.05, 100.09, 100.10, kind="rpc_async", thread="t2",
              tensor=4096),
        _call(3, "master", "w2", "stage2", 100.06, 100.07, 100.11, 100.12, kind="rpc_async"),
        _call(1, "w2", "w1", "fetch", 100.071, 100.072, 100.074, 100.075, kind="to_here", thread="t3",
              parent="master:3"),
        _call(4, "master", "w2", "stage2", 100.10, 100.11, 100.15, 100.16, kind="rpc_async", thread="t2"),
        _call(5, "master", "w1", "boom", 100.17, 100.18, 100.19, 100.20, error="ValueError: no"),
        _call(6, "master", "w2", "lost", 100.18, None, None, None),
    ],
    "clocks": [{"worker": "master", "offset": 0.0, "bound": 0.0},
               {"worker": "w1", "offset": 0.0, "bound": 0.0},
               {"worker": "w2", "offset": 0.0, "bound": 0.0}],
    "start": 100.0, "end": 100.25, "dropped": 0,
}


def trace_synthetic(calls: int = 3000, workers: int = 4) -> dict:
    """``calls`` short calls from the driver to ``workers`` workers, 1 ms apart."""
    names = [f"w{i}" for i in range(1, workers + 1)]
    rows = []
    for k in range(calls):
        t = 10.0 + k * 0.001
        rows.append(_call(k, "master", names[k % workers], f"f{k % 3}", t, t + 0.0001, t + 0.0008,
                          t + 0.0009, thread=f"t{k % 2}"))
    return {"workers": [{"name": "master", "id": 0, "host": "127.0.0.1", "pid": 1}]
            + [{"name": n, "id": i + 1, "host": "127.0.0.1", "pid": i + 2} for i, n in enumerate(names)],
            "calls": rows, "clocks": [], "start": 10.0, "end": 10.0 + calls * 0.001, "dropped": 0}


def autograd_wide(workers=("master", "ps"), per_layer: int = 4, layers: int = 4) -> dict:
    """An autograd graph as wide as tutorial 05's (two lanes of ``per_layer`` long-named
    functions per layer): well over an 848 px output at 1:1."""
    nodes, edges = [], []
    for w in workers:
        for d in range(layers):
            for k in range(per_layer):
                fn = f"{w}:{d * per_layer + k}"
                param = f"model.layers.{k}.self_attention.weight" if d == layers - 1 else None
                nodes.append({"id": fn, "worker": w, "name": "AccumulateGrad" if param else "AddmmBackward0",
                              **({"param": param} if param else {})})
                if d:
                    edges.append({"src": f"{w}:{(d - 1) * per_layer + k}", "dst": fn, "kind": "local"})
    edges.append({"src": f"{workers[0]}:0", "dst": f"{workers[1]}:1", "kind": "rpc"})
    return {"context_id": 3, "workers": list(workers), "nodes": nodes, "edges": edges,
            "gradients": [{"worker": workers[1], "param": "model.layers.0.self_attention.weight",
                           "shape": [4, 4], "norm": 1.5}]}
