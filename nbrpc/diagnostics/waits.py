"""The cluster's pending calls as a wait-for graph, and the hangs it names.

Parts:

- ``member_report``: one member's calls in flight and served (``recording.pending``)
  with the stacks of its threads; each member runs it on its side channel
  (``cluster.control`` and ``member.control``), not over RPC, so it answers while every RPC thread is blocked.
- ``snapshot``: every member's report joined (pure): calls with their state
  (queued, running, waiting), what each waits on, where a blocked one is blocked,
  and ``findings``: ``cycle``, ``pool_exhausted``, ``blocked``, ``waits_on_caller``,
  ``dead_member``, ``unset_future``, each with a message that says what is stuck,
  where, and what to do.
- ``explain``: one call's chain in words, for a timeout's or an interrupt's error.

A call is stuck when the end of its chain is queued behind busy RPC threads, blocked
on a lock, condition, event, queue or future, waits on an ``@async_execution``
function's future that nothing left running could complete, or was sent to a member
that is gone or frozen, for at least ``STUCK`` seconds; a call that only runs long is
never a finding.
"""

from __future__ import annotations

import time

from ..calls import serving
from ..recording.paused import PAUSED
from ..recording.pending import PENDING
from . import stacks as stacks_mod

# Seconds a chain's end must have been queued or blocked before it is a finding.
STUCK = 1.0


def member_report(name: str, cells: stacks_mod.Cells | None = None, files: bool = False) -> dict:
    """This member's pending calls and the stacks of its threads (plain data); with
    ``files`` (the driver's own, read in process), its cells' file names too, which name
    where notebook code run elsewhere made something (an unset future)."""
    report = PENDING.report()
    if files and cells is not None:
        report["cells"] = dict(cells.numbers)
    report["name"] = name
    report["threads"] = stacks_mod.local_threads(cells)
    report["time"] = time.time()
    report["inline"] = serving.pool.inline  # calls whose function runs on one of torch's threads
    report["paused"] = PAUSED.report()  # threads stopped in a debugger (pdb, JupyterLab's)
    return report


class Graph:
    """Calls joined across members, with lookups the findings need."""

    def __init__(self, members: list[dict], now: float):
        self.now = now
        self.members = {m["name"]: m for m in members}
        self.by_pid = {m["report"]["pid"]: m["name"] for m in members if m.get("report")}
        self.calls: dict[str, dict] = {}
        self.served: dict[str, tuple[str, dict]] = {}  # call id -> (member, served entry)
        self.awaited: dict[str, tuple[str, dict]] = {}  # call id -> (member, its future's entry)
        self.frames: dict[tuple[str, int], list] = {}  # (member, thread) -> frames
        self.paused: dict[tuple[str, int], dict] = {}  # (member, thread) -> where it stopped
        self.cells = stacks_mod.Cells()  # the driver's cells, for sites on no stack
        for m in members:
            report = m.get("report") or {}
            self.cells.numbers.update(report.get("cells", {}))
            for thread in report.get("threads", []):
                self.frames[(m["name"], thread["id"])] = thread["frames"]
            for entry in report.get("served", []):
                self.served[entry["id"]] = (m["name"], entry)
            for entry in report.get("awaited", []):
                self.awaited[entry["id"]] = (m["name"], entry)
            for entry in report.get("paused", []):
                self.paused[(m["name"], entry["thread"])] = entry
        for m in members:
            for entry in (m.get("report") or {}).get("outgoing", []):
                self.calls[entry["id"]] = self._call(m["name"], entry)
        for call_id, (member, entry) in self.served.items():
            if call_id not in self.calls:  # its caller gave up (timed out, interrupted)
                caller = self.by_pid.get(_pid_of(call_id), "?")
                self.calls[call_id] = self._call(caller, {
                    "id": call_id, "callee": member, "function": entry["function"], "site": None,
                    "thread": None, "since": entry["since"], "kind": "abandoned", "on": None})
        self._link()

    def _call(self, caller: str, entry: dict) -> dict:
        site = entry.get("site")
        return {"id": entry["id"], "caller": caller, "callee": entry["callee"],
                "function": entry["function"], "site": self.label(caller, site),
                "thread": entry.get("thread"), "since": entry["since"], "kind": entry.get("kind"),
                "state": "running", "waits_on": [entry["on"]] if entry.get("on") else []}

    def label(self, member: str, site) -> str | None:
        """A call site (file, line) as "cell N, line L" where a member knows the file."""
        if not site:
            return None
        file, line = site
        for frames in self.frames.values():
            for frame in frames:
                if frame["file"] == file and "cell" in frame:
                    return frame["cell"].rsplit(", line ", 1)[0] + f", line {line}"
        return self.cells.label(file, line) or f"{file.rsplit('/', 1)[-1]}, line {line}"

    def _link(self) -> None:
        by_thread: dict[tuple[str, int], list[str]] = {}
        for call in self.calls.values():
            # A to_here names the remote that makes its value; one over since is no wait.
            call["waits_on"] = [c for c in call["waits_on"] if c in self.calls]
            if call["thread"] is not None:
                by_thread.setdefault((call["caller"], call["thread"]), []).append(call["id"])
        for call in self.calls.values():
            if call["kind"] == "rpc_on":  # the cell runs on the callee kernel's main thread
                main = (self.members.get(call["callee"], {}).get("report") or {}).get("main_thread")
                if main is not None:
                    call["serving_thread"] = main
                    call["served_since"] = call["since"]
                    call["waits_on"] = by_thread.get((call["callee"], main), [])
                    user = stacks_mod.innermost_user(self.frames.get((call["callee"], main), []))
                    if user is not None:
                        call["at"] = stacks_mod.where(user)
                    call["state"] = "waiting" if call["waits_on"] else "running"
                    self._pause(call, self.paused.get((call["callee"], main)))
                    if call["state"] == "running":
                        blocked = stacks_mod.blocked_at(self.frames.get((call["callee"], main), []))
                        if blocked is not None:
                            call["blocked_at"] = blocked
                continue
            callee = self.members.get(call["callee"], {})
            if callee.get("state", "running") != "running":
                call["state"] = "waiting"
                continue
            served = self.served.get(call["id"])
            if served is not None:
                member, entry = served
                call["serving_thread"] = entry["thread"]
                call["served_since"] = entry["since"]
                mine = [c for c in by_thread.get((member, entry["thread"]), []) if c != call["id"]]
                call["waits_on"] = mine
                frames = self.frames.get((member, entry["thread"]), [])
                user = stacks_mod.innermost_user(frames)
                if user is not None:
                    call["at"] = stacks_mod.where(user)
                stop = self.paused.get((member, entry["thread"]))
                if stop is not None:  # a person steps through it: not a hang
                    call["state"] = "paused"
                    call["paused_at"] = self.label(member, (stop["file"], stop["line"]))
                elif mine:
                    call["state"] = "waiting"
                else:
                    blocked = stacks_mod.blocked_at(frames)
                    if blocked is not None:
                        call["blocked_at"] = blocked
            elif call["id"] in self.awaited:
                member, entry = self.awaited[call["id"]]
                call["future"] = {"made": self.label(member, entry["made"]), "since": entry["since"]}
                call["state"] = "waiting"
            elif call["waits_on"]:
                call["state"] = "waiting"
            elif call["kind"] == "backward" and self._pause(call, self.unserved_pause(call["callee"])):
                pass  # its gradients run a function that a person steps through there
            elif call["kind"] != "abandoned" and self.now - call["since"] > STUCK / 2 \
                    and self.full(call["callee"]):
                # Not begun there (a Python function's would be served), or a message
                # torch serves itself (a fetch, a gradient): every RPC thread is busy.
                call["state"] = "queued"

    def _pause(self, call: dict, stop: dict | None) -> bool:
        """Mark ``call`` paused where ``stop`` (a paused thread's entry, or None) stands."""
        if stop is not None:
            call["state"] = "paused"
            call["paused_at"] = self.label(call["callee"], (stop["file"], stop["line"]))
        return stop is not None

    def unserved_pause(self, member: str) -> dict | None:
        """A thread of ``member`` paused in a debugger outside the calls it serves (a backward's)."""
        served = {entry["thread"] for name, entry in self.served.values() if name == member}
        return next((stop for (name, thread), stop in self.paused.items()
                     if name == member and thread not in served), None)

    def stuck(self, call: dict) -> str | None:
        """Why the chain ends at ``call``: "queued", "blocked", "gone", "frozen" or None."""
        state = self.members.get(call["callee"], {}).get("state", "running")
        if state != "running":
            return state
        if self.now - call["since"] < STUCK or call["state"] == "paused":
            return None
        if call["state"] == "queued":
            return "queued"
        if call.get("future") and self.now - call["future"]["since"] >= STUCK and self.idle(call["callee"]):
            return "unset_future"
        if call.get("blocked_at") and self.now - call.get("served_since", self.now) >= STUCK:
            return "blocked"
        return None

    def chains(self, paused: bool = False) -> list[list[dict]]:
        """Every path from a call nothing waits on to a stuck call (``paused``: to a
        call paused in a debugger)."""
        inner = {c for call in self.calls.values() for c in call["waits_on"]}
        out = []

        def walk(path: list[dict]) -> None:
            call = path[-1]
            nexts = [self.calls[c] for c in call["waits_on"] if c in self.calls and self.calls[c] not in path]
            if not nexts:
                if (call["state"] == "paused") if paused else self.stuck(call):
                    out.append(path)
                return
            for nxt in nexts:
                walk(path + [nxt])

        for call in sorted(self.calls.values(), key=lambda c: c["since"]):
            if call["id"] not in inner:
                walk([call])
        return out

    def idle(self, name: str) -> bool:
        """Whether member ``name`` runs no call and waits on none (nothing there runs
        that could complete a future)."""
        return (not any(member == name for member, _ in self.served.values())
                and not any(c["caller"] == name for c in self.calls.values()))

    def gone(self) -> set[str]:
        """Members that are gone or frozen."""
        return {n for n, m in self.members.items() if m.get("state", "running") != "running"}

    def full(self, name: str) -> bool:
        """Whether every one of torch's RPC threads of ``name`` runs a call's function
        (calls nbrpc handed to threads of its own take none)."""
        pool = self.threads_of(name)
        report = self.members.get(name, {}).get("report") or {}
        return pool is not None and report.get("inline", self.busy(name)) >= pool

    def threads_of(self, name: str) -> int | None:
        return self.members.get(name, {}).get("pool")

    def busy(self, name: str) -> int:
        return sum(1 for member, _ in self.served.values() if member == name)


def snapshot(members: list[dict], now: float | None = None) -> dict:
    """The waits snapshot (its shape: docs/guide/hangs.md) from every member's probe.

    Beyond the fields docs/guide/hangs.md lists, a call may carry ``at`` (where its function runs now) and
    ``future`` (``{"made": "cell N, line L" or None, "since"}``: its ``@async_execution``
    function returned that future, not complete yet); a finding's ``kind`` may also be
    ``unset_future``: the chain ends at such a future, unset for ``STUCK`` s, on a member
    that runs and waits on nothing that could complete it.

    ``members``: ``{"name", "state": running|gone|frozen, "why"?, "pool": RPC threads,
    "report": member_report() or None}``.
    """
    return snapshot_of(Graph(members, time.time() if now is None else now))


def snapshot_of(graph: Graph) -> dict:
    """The waits snapshot of a joined graph."""
    members = list(graph.members.values())
    calls = []
    for call in sorted(graph.calls.values(), key=lambda c: c["since"]):
        out = {k: call[k] for k in ("id", "caller", "callee", "function", "site", "thread", "since",
                                     "state", "waits_on")}
        if call.get("blocked_at"):
            out["blocked_at"] = call["blocked_at"]
        if call.get("at"):
            out["at"] = call["at"]
        if call.get("future"):
            out["future"] = call["future"]
        if call.get("paused_at"):
            out["paused_at"] = call["paused_at"]
        calls.append(out)
    summary = [{"name": m["name"], "threads": m.get("pool"), "busy": graph.busy(m["name"]),
                "state": m.get("state", "running")} for m in members]
    for member in summary:  # a person steps there: "paused in the debugger at cell N, line M"
        stop = next((s for (name, _), s in graph.paused.items() if name == member["name"]), None)
        if stop is not None:
            member["paused_at"] = graph.label(member["name"], (stop["file"], stop["line"]))
    return {"members": summary, "calls": calls, "findings": findings(graph)}


def findings(graph: Graph) -> list[dict]:
    out: list[dict] = []
    seen: set = set()
    for path in graph.chains():
        finding = _finding(graph, path)
        if finding is None:
            continue
        key = (finding["kind"], tuple((c["callee"], c["function"]) for c in path[1:]) or path[0]["function"])
        if key not in seen:
            seen.add(key)
            out.append(finding)
    out.extend(_pools(graph))
    return out


def _finding(graph: Graph, path: list[dict]) -> dict | None:
    leaf = path[-1]
    why = graph.stuck(leaf)
    members = _members(path)
    chain = describe(graph, path)
    ids = [c["id"] for c in path]
    root_caller = path[0]["caller"]
    back = leaf["callee"] in [path[0]["caller"]] + [c["callee"] for c in path[:-1]]
    if why in ("gone", "frozen"):
        member = graph.members[leaf["callee"]]
        what = member.get("why") or why
        return {"kind": "dead_member", "members": members, "calls": ids,
                "message": f"{chain} ({what}): it answers nothing. Interrupt the cell; start a new "
                           f"cluster (%rpc_shutdown, then %rpc_init) to get {leaf['callee']} back"}
    if why == "unset_future":
        return {"kind": "unset_future", "members": members, "calls": ids,
                "message": f"{chain}. Its reply leaves only when that future completes, and nothing "
                           f"runs on {leaf['callee']} that could complete it. Call set_result (or "
                           "set_exception) on it on every path: where the batch it waits for fills, "
                           "or in a callback chained with then() on the work it waits for"}
    if back and leaf["callee"] == root_caller and _from_cell(graph, path[0]):
        return {"kind": "waits_on_caller", "members": members, "calls": ids,
                "message": f"{chain}. {root_caller} waits on a call whose callee waits on "
                           f"{root_caller} itself. Do not hold what the callee needs while waiting "
                           "(release the lock first), or use rpc_async and wait later"}
    if why == "queued" and not back:
        return None  # a pool that is merely full: ``pool_exhausted`` says so
    if why == "blocked":
        if not back:
            # Nothing in the chain can hold what it waits for: a wait for data or work,
            # which may well end (the calls show it blocked; no finding).
            return None
        blocked = leaf["blocked_at"]
        return {"kind": "blocked", "members": members, "calls": ids,
                "message": f"{chain}. A call earlier in the chain runs on {leaf['callee']} and waits on "
                           f"it: if it holds that {blocked['what']}, neither can go on. Release the "
                           f"{blocked['what']} before the nested call, or make the nested call not need it"}
    return {"kind": "cycle", "members": members, "calls": ids,
            "message": f"{chain}. The calls wait on each other in a cycle back to {leaf['callee']}. "
                       "Make the waiting function @rpc.functions.async_execution (return a future "
                       "instead of waiting), or give it more threads (%rpc_init --threads N)"}


def _pools(graph: Graph) -> list[dict]:
    out = []
    for name in graph.members:
        queued = [c for c in graph.calls.values()
                  if c["callee"] == name and c["state"] == "queued" and graph.now - c["since"] >= STUCK]
        pool = graph.threads_of(name)
        busy = graph.busy(name)
        if not queued or pool is None or busy < pool:
            continue
        busy_calls = [c for c in graph.calls.values() if c["callee"] == name and c.get("serving_thread") is not None]
        running = sorted({c["function"] for c in busy_calls})
        waiting = sorted({c["function"] for c in queued})
        out.append({
            "kind": "pool_exhausted", "members": [name], "calls": [c["id"] for c in busy_calls + queued],
            "message": f"all {pool} RPC threads of {name} are busy (running {', '.join(running)}) and "
                       f"{len(queued)} call{'s' * (len(queued) > 1)} to {name} "
                       f"({', '.join(waiting)}) wait{'s' * (len(queued) == 1)} behind them. Make the "
                       "functions that block @rpc.functions.async_execution (return a future "
                       f"instead of waiting), or start with more threads (%rpc_init --threads {pool * 2})"})
    return out


def _from_cell(graph: Graph, call: dict) -> bool:
    """True if ``call`` was made by a thread that serves no call (a cell, a script)."""
    return not any(c.get("serving_thread") == call["thread"] and c["callee"] == call["caller"]
                   for c in graph.calls.values())


def _members(path: list[dict]) -> list[str]:
    out = [path[0]["caller"]]
    for call in path:
        if call["callee"] not in out:
            out.append(call["callee"])
    return out


def describe(graph: Graph, path: list[dict], head: bool = True) -> str:
    """A chain in words: "worker1 runs outer (cell 3, line 6), which waits on its call to
    inner on worker1, blocked at `with lock:` (cell 3, line 3)"; with ``head``, first
    what the cell that made the chain's first call waits on."""
    first = path[0]
    lead = ""
    if head and _from_cell(graph, first):
        at = f" ({first['site']})" if first.get("site") else ""
        joint = ": " if first.get("serving_thread") is not None else ", "
        lead = f"{first['caller']} waits on {first['function']} on {first['callee']}{at}{joint}"
    parts = []
    for i, call in enumerate(path):
        served = call.get("serving_thread") is not None
        at = f" ({call['at']})" if served and call.get("at") else ""
        if i == 0:
            if served:
                parts.append(f"{call['callee']} runs {call['function']}{at}")
            elif not lead:
                parts.append(f"{call['caller']} waits on {call['function']} on {call['callee']}")
            continue
        its = "its call to " if path[i - 1].get("serving_thread") is not None else ""
        parts.append(f"which waits on {its}{call['function']} on {call['callee']}"
                     + ("" if i == len(path) - 1 else at))
    leaf = path[-1]
    why = graph.stuck(leaf) if len(path) else None
    if why == "blocked":
        b = leaf["blocked_at"]
        where = b.get("cell") or f"{b['file'].rsplit('/', 1)[-1]}, line {b['line']}"
        parts.append(f"blocked at `{b['code']}` ({where})" if b["code"] else f"blocked on a {b['what']} ({where})")
    elif why == "queued":
        pool = graph.threads_of(leaf["callee"])
        of = f"all {pool} of " if pool else "all of "
        parts.append(f"queued: {of}{leaf['callee']}'s RPC threads are busy")
    elif why in ("gone", "frozen"):
        parts.append(f"but {leaf['callee']} is {why}")
    elif why == "unset_future":
        made = leaf["future"]["made"]
        parts.append("whose @async_execution function returned a future that nobody has set"
                     + (f" (made at {made})" if made else ""))
    return (lead + ", ".join(parts)) if parts else lead.rstrip(":, ")


def explain(graph: Graph, call_id: str) -> tuple[str | None, bool]:
    """Call ``call_id``'s chain in words, and whether it is stuck: to its stuck end, or
    where its callee is (a call that runs long)."""
    call = graph.calls.get(call_id)
    if call is None:
        return None, False
    for path in graph.chains():
        ids = [c["id"] for c in path]
        if call_id in ids:
            return describe(graph, path[ids.index(call_id):], head=False), True
    if call.get("paused_at"):
        return f"{call['callee']} runs {call['function']}, {paused_text(call)}", False
    for path in graph.chains(paused=True):
        ids = [c["id"] for c in path]
        if call_id in ids and path[-1]["state"] == "paused":
            leaf = path[-1]
            return describe(graph, path[ids.index(call_id):], head=False) + f", {paused_text(leaf)}", False
    if call.get("at"):
        return f"{call['callee']} runs {call['function']} ({call['at']})", False
    return None, False


def paused_text(call: dict) -> str:
    """Where a paused call stands, in words."""
    return f"paused in the debugger at {call['paused_at']}" if call.get("paused_at") else "paused in the debugger"


def graph(members: list[dict], now: float | None = None) -> Graph:
    return Graph(members, time.time() if now is None else now)


def _pid_of(call_id: str) -> int | None:
    try:
        return int(call_id.split("-", 1)[0])
    except ValueError:
        return None
