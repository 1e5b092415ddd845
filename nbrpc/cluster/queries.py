"""What a running cluster is waiting on, and every member's stacks: ``nbrpc.waits()``, ``nbrpc.stacks()``.

Parts:

- ``Queries``: one per cluster, handed what it reads (the driver's name, the RPC threads
  per member, the workers, whether the cluster runs, the control channels), so that it
  never reaches into the cluster. It asks every member at once (the driver in process,
  the workers over their control channels) and keeps the latest graphs, which explain a
  timeout whose chain came apart a moment before.
- ``waits(cluster)`` and ``stacks(cluster, members)``: the public queries of the running
  cluster, or a ``NoClusterError`` that says to start one.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..diagnostics import stacks as stacks_mod
from ..diagnostics import waits as waits_mod
from ..errors import NoClusterError, UnknownWorkerError

if TYPE_CHECKING:
    from ..launchers.base import Worker
    from .control import Probes

# Seconds a snapshot may serve to explain a call whose chain came apart since, and
# how many are kept.
RECENT = 5.0
HISTORY = 8


class Queried(Protocol):
    """What the public queries read of a cluster (``cluster.Cluster`` is one); declared
    here so that this module never imports the cluster that imports it."""

    state: str
    queries: Queries


class Queries:
    """A cluster's wait-for graph, stacks and explanations, from every member's probe."""

    def __init__(self, driver_name: str, threads: int, workers: Callable[[], list[Worker]],
                 running: Callable[[], bool], probes: Probes):
        self.driver_name, self.threads = driver_name, threads
        self._workers, self._running, self._probes = workers, running, probes
        # The latest snapshots' graphs: a timeout or a death is explained by the last
        # one that saw the chain whole.
        self.history: collections.deque[waits_mod.Graph] = collections.deque(maxlen=HISTORY)

    def members(self, names: list[str] | None = None) -> list[dict]:
        """Every member's probe, the driver's first, as ``waits.snapshot`` takes them."""
        workers = self._workers()
        _check_names(names, [self.driver_name] + [w.name for w in workers])
        cells = _driver_cells()
        members = []
        if names is None or self.driver_name in names:
            members.append({"name": self.driver_name, "state": "running", "pool": self.threads,
                            "report": waits_mod.member_report(self.driver_name, cells, files=True)})
        chosen = [w for w in workers if names is None or w.name in names]
        answers = self._probes.ask(chosen)
        for w in chosen:
            member = {"name": w.name, "pool": self.threads, "pid": w.pid, **answers[w.name]}
            if member.get("report"):
                stacks_mod.relabel(member["report"]["threads"], cells)
            members.append(member)
        for m in members:
            m.setdefault("pid", (m.get("report") or {}).get("pid"))
        return members

    def waits(self) -> dict:
        """The pending calls as a wait-for graph with findings (``nbrpc.waits()``)."""
        graph = waits_mod.graph(self.members())
        self.history.append(graph)
        return waits_mod.snapshot_of(graph)

    def explain(self, key: str) -> str | None:
        """What call ``key`` of this member waits on, in words (for a timeout's or an
        interrupt's error): from a fresh probe of every member, or, where the chain has just
        come apart (the callee's own call timed out a moment earlier), from the last one."""
        if not self._running():
            return None
        fresh = waits_mod.graph(self.members())
        text, stuck = waits_mod.explain(fresh, key)
        callee = fresh.calls.get(key, {}).get("callee")
        if stuck and callee not in fresh.gone():
            return text
        for earlier in reversed(self.history):
            if fresh.now - earlier.now > RECENT or callee in earlier.gone():
                continue
            said, was_stuck = waits_mod.explain(earlier, key)
            if said and (was_stuck or callee in fresh.gone()):
                return said
        return text

    def stacks(self, names: list[str] | None = None) -> dict:
        """member -> ``{"state", "pid", "threads": [{"id", "name", "serving", "frames"}]}``,
        notebook frames with their cell and line (``nbrpc.stacks()``)."""
        out = {}
        for m in self.members(names):
            entry = {"state": m["state"], "pid": m.get("pid")}
            if m.get("why"):
                entry["why"] = m["why"]
            report = m.get("report")
            if report:
                serving = {e["thread"]: e["function"] for e in report["served"]}
                entry["threads"] = [{**t, "serving": serving.get(t["id"])} for t in report["threads"]]
            out[m["name"]] = entry
        return out


def _check_names(names: list[str] | None, known: list[str]) -> None:
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise UnknownWorkerError(
            f"no member named {', '.join(map(repr, unknown))} in this cluster; "
            f"the members are: {', '.join(known)}")


def _driver_cells() -> stacks_mod.Cells:
    """The driver kernel's cells (IPython's compile cache), when it runs in one."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return stacks_mod.Cells(numbers if numbers is not None else {})


def _require(cluster: Queried | None) -> Queried:
    if cluster is None or cluster.state != "running":
        raise NoClusterError("no nbrpc cluster is running in this process; start one first "
                             "(%rpc_init -n 2, or nbrpc.start(n=2))")
    return cluster


def waits(cluster: Queried | None) -> dict:
    """``nbrpc.waits()``: the cluster's pending calls as a wait-for graph with findings."""
    return _require(cluster).queries.waits()


def stacks(cluster: Queried | None, members: list[str] | None = None) -> dict:
    """``nbrpc.stacks()``: every member's threads and frames, or those of ``members``."""
    return _require(cluster).queries.stacks(members)
