"""How cluster events look in a notebook (widgets, HTML) and in a terminal (text)."""

from __future__ import annotations

import sys

from IPython.display import display, publish_display_data

from ..cluster import text_progress


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
        if done == total and "up in" in message:
            for widget in (label, bar, box):
                widget.close()
            print(f"nbrpc: {message}")

    return report


class KernelOutput:
    """Puts worker outputs into the running cell: streams tagged, rich data as is."""

    def stream(self, worker: str, name: str, text: str) -> None:
        out = sys.stderr if name == "stderr" else sys.stdout
        out.write(text)
        out.flush()

    def display(self, worker: str, data: dict, metadata: dict) -> None:
        publish_display_data(data, metadata)
