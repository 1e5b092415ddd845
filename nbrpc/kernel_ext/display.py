"""How cluster events look in a notebook (widgets, HTML) and in a terminal (text)."""

from __future__ import annotations

import threading

from IPython.display import clear_output, display, publish_display_data

from ..calls import output
from ..cluster.cluster import text_progress
from ..launchers.base import Started


def in_notebook() -> bool:
    """True inside a Jupyter kernel (a front end can render widgets and HTML)."""
    from IPython import get_ipython

    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def start_progress():
    """A progress reporter for ``Cluster.start``: a bar in a notebook, text elsewhere."""
    if not in_notebook():
        return text_progress
    import ipywidgets

    bar = label = box = None

    def report(done: int, total: int, message: str) -> None:
        nonlocal bar, label, box
        if bar is None:
            bar = ipywidgets.IntProgress(value=0, min=0, max=total, description="workers")
            label = ipywidgets.Label()  # the latest event ("job 4321 pending: Resources, 40 s")
            box = ipywidgets.HBox([bar, label])
            display(box)
        bar.value = done
        bar.description = f"{done}/{total} joined"
        label.value = message
        if isinstance(message, Started):
            for widget in (label, bar, box):
                widget.close()
            print(f"nbrpc: {message}")

    return report


class KernelOutput(output.PrintOutput):
    """Puts worker outputs into the running cell: streams tagged, rich data as is."""

    def display(self, worker: str, data: dict, metadata: dict, transient: dict | None = None,
                update: bool = False) -> None:
        publish_display_data(data, metadata, transient=transient, update=update)

    def clear(self, worker: str, wait: bool) -> None:
        clear_output(wait=wait)


class CellOutput:
    """What workers write outside ``%%rpc_on`` (calls, background threads): shown in
    the running cell, tagged; with no cell running, held until the next one starts.

    ``deliver`` runs on the driver's RPC threads, whose writes ipykernel puts in the
    cell it runs now; the IPython events ``pre_run_cell`` and ``post_run_cell`` tell
    whether one runs (the extension is loaded from a cell, so one does at first).
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._running = True
        self._held: list[tuple] = []
        self._shown = output.Shown(KernelOutput())

    def deliver(self, worker: str, pieces: list[tuple], final: bool) -> None:
        with self._lock:
            if self._running:
                self._shown.show(worker, pieces, final)
            else:
                self._held.append((worker, pieces, final))

    def pre_run_cell(self, info=None) -> None:
        with self._lock:
            self._running = True
            held, self._held = self._held, []
            late = set()
            for worker, pieces, final in held:
                if final and worker not in late:
                    # The end of a call whose cell had ended (its caller gave up, or never
                    # waited): not this cell's output.
                    late.add(worker)
                    self._shown.output.stream(worker, "stderr", f"[{worker}] (late: what a call wrote "
                                                                "after the cell that made it had ended)\n")
                self._shown.show(worker, pieces, final)

    def post_run_cell(self, result=None) -> None:
        with self._lock:
            self._shown.flush()  # a partial line ends with its cell
            self._running = False

    def register(self, shell) -> None:
        shell.events.register("pre_run_cell", self.pre_run_cell)
        shell.events.register("post_run_cell", self.post_run_cell)
        output.SINKS.add(self.deliver)

    def unregister(self, shell) -> None:
        shell.events.unregister("pre_run_cell", self.pre_run_cell)
        shell.events.unregister("post_run_cell", self.post_run_cell)
        output.SINKS.discard(self.deliver)
