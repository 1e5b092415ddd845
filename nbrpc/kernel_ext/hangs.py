"""A stuck cell names what it waits on, in its own output, by itself.

``HangWatch``: while a cell runs, a thread looks every ``POLL`` s whether this kernel
has a call in flight for more than ``AFTER`` s (``rpc_sync``, a future's ``wait``,
``to_here``, a backward or an optimizer step, which all go through the calls layer);
if so it asks every member over the side channel (``nbrpc.waits()``) and, when a
finding holds, shows it in the running cell, updated in place, and a one-line summary
when the cell ends. A call that is only long shows nothing, unless ``always`` (then the
cell's pending calls show too).
"""

from __future__ import annotations

import html
import threading
import time

from IPython.display import display

from .. import settings
from ..cluster import cluster as cluster_mod
from ..cluster import queries
from ..recording.pending import ID, PENDING, SINCE

POLL = 0.5
AFTER = 1.0
# A member that misses one probe may only be slow to answer (a loaded machine, a long
# import holding the GIL): the cell calls it frozen once it has stayed so this long
# (``NBRPC_FROZEN_AFTER`` sets another). ``nbrpc.waits()``, asked by hand, says so at the
# first missed probe.
FROZEN_AFTER = 3.0


class HangWatch:
    """Watches the running cell's calls; shows the findings of the calls it waits on."""

    def __init__(self, always: bool = False):
        self.always = always
        self.frozen_after = settings.frozen_after(FROZEN_AFTER)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle = None
        self._shown: list[dict] = []
        self._paused = False  # the display shows a call paused in a debugger
        self._frozen_since: dict[str, float] = {}
        self._lock = threading.Lock()

    def pre_run_cell(self, info=None) -> None:
        with self._lock:
            self._stop = threading.Event()
            self._handle, self._shown, self._frozen_since = None, [], {}
            self._thread = threading.Thread(target=self._watch, args=(self._stop,),
                                            name="nbrpc-hang-watch", daemon=True)
            self._thread.start()

    def post_run_cell(self, result=None) -> None:
        with self._lock:
            self._stop.set()
            shown, self._shown = self._shown, []
        if shown:
            kinds = ", ".join(sorted({f["kind"] for f in shown}))
            members = ", ".join(sorted({m for f in shown for m in f["members"]}))
            print(f"nbrpc: this cell waited on a hang ({kinds}; {members}): {shown[0]['message']}")

    def _watch(self, stop: threading.Event) -> None:
        began = time.time()
        while not stop.wait(POLL):
            oldest = PENDING.oldest()
            cluster = cluster_mod.current()
            if oldest is None or cluster is None or cluster.state != "running":
                continue
            if time.time() - oldest < AFTER:
                continue
            try:
                snap = queries.waits(cluster)
            except Exception:  # the cluster is going away; the cell's own error says why
                continue
            if stop.is_set():
                return
            self._show(snap, began)

    def _show(self, snap: dict, began: float) -> None:
        # This cell's calls only: a hang an earlier cell left behind is not this one's.
        mine = {entry[ID] for entry in PENDING.in_flight() if entry[SINCE] >= began}
        findings = self.settled([f for f in snap["findings"] if mine.intersection(f["calls"])],
                                snap["members"], time.monotonic())
        paused = [c for c in snap["calls"] if c["state"] == "paused"]
        if not findings and not (self.always and snap["calls"]) and not paused:
            if self._handle is not None and (self._shown or self._paused):
                # A hang that cleared says so; a pause that ended leaves no line.
                self._handle.update(Report([], [], resolved=bool(self._shown)))
                self._paused = False
            return
        self._paused = bool(paused)
        report = Report(findings, snap["calls"] if self.always or findings else [], paused=paused)
        with self._lock:
            if self._stop.is_set():
                return
            if findings:
                self._shown = findings
            if self._handle is None:
                self._handle = display(report, display_id=True)
            else:
                self._handle.update(report)

    def settled(self, findings: list[dict], members: list[dict], now: float) -> list[dict]:
        """``findings`` less those about a member frozen for under ``frozen_after`` s."""
        frozen = {m["name"] for m in members if m["state"] == "frozen"}
        self._frozen_since = {name: self._frozen_since.get(name, now) for name in frozen}
        unsure = {name for name, since in self._frozen_since.items() if now - since < self.frozen_after}
        return [f for f in findings if f["kind"] != "dead_member" or not unsure.intersection(f["members"])]

    def register(self, shell) -> None:
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)

    def unregister(self, shell) -> None:
        self._stop.set()
        shell.events.unregister("pre_run_cell", self.pre_run_cell)
        shell.events.unregister("post_run_cell", self.post_run_cell)


class Report:
    """Findings (and pending calls) as text and HTML."""

    def __init__(self, findings: list[dict], calls: list[dict], resolved: bool = False,
                 paused: list[dict] = ()):
        self.findings, self.calls, self.resolved = findings, calls, resolved
        self.paused = list(paused)  # calls stopped in a debugger: a person steps, no hang

    def _lines(self) -> list[str]:
        if self.resolved:
            return ["nbrpc: the hang shown here has cleared"]
        lines = [f"nbrpc: stuck ({f['kind']}): {f['message']}" for f in self.findings]
        lines += [f"nbrpc: {c['callee']} runs {c['function']}, paused in the debugger"
                  + (f" at {c['paused_at']}" if c.get("paused_at") else "") + " (not a hang)" for c in self.paused]
        for call in self.calls:
            where = f" at {call['site']}" if call.get("site") else ""
            lines.append(f"  {call['caller']} -> {call['callee']}: {call['function']} "
                         f"{call['state']}{where}")
        return lines

    def __repr__(self) -> str:
        return "\n".join(self._lines())

    def _repr_html_(self) -> str:
        rows = []
        for line in self._lines():
            colour = "var(--jp-error-color1, #d32f2f)" if line.startswith("nbrpc: stuck") else "inherit"
            rows.append(f'<div style="color:{colour};white-space:pre-wrap">{html.escape(line)}</div>')
        return '<div class="nbrpc-waits">' + "".join(rows) + "</div>"
