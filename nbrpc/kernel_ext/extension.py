"""nbrpc's extension in one IPython shell: what ``%load_ext nbrpc`` sets up, and takes back."""

from __future__ import annotations

from typing import ClassVar

from ..launchers import template
from .advice import RpcAdvice
from .display import CellOutput
from .hangs import HangWatch
from .lab_debugger import LabDebugger
from .panel import Panel
from .worker_pdb import WorkerPdb


class Extension:
    """One shell's parts: torch's advice, where workers' output shows, the hang watch, the
    side panel's answers, debugging across workers."""

    # The loaded extensions, by the shell's id (one in a kernel).
    loaded: ClassVar[dict[int, Extension]] = {}

    def __init__(self, shell):
        self.shell = shell
        # torch's "Call init_rpc first" becomes one line that says to run %rpc_init.
        self.advice = RpcAdvice()
        # What workers write in calls and background threads shows in the running cell.
        self.cell_output = CellOutput()
        # A cell stuck on the cluster says on what, by itself.
        self.hang_watch = HangWatch()
        # JupyterLab's side panel asks this kernel about its cluster on the control channel.
        self.panel = Panel()
        # Members' pdb prompts in the calling cell; %debug opens a member's frames.
        self.worker_pdb = WorkerPdb(shell)
        # JupyterLab's debugger reaches the members' debuggers through this kernel's.
        self.lab_debugger = LabDebugger()

    @classmethod
    def load(cls, shell) -> Extension:
        """Set the extension up in ``shell`` (again: the same parts, registered once)."""
        extension = cls.loaded.get(id(shell))
        if extension is None:
            extension = cls.loaded[id(shell)] = cls(shell)
            extension.advice.register(shell)
            extension.cell_output.register(shell)
            extension.hang_watch.register(shell)
            extension.panel.register(shell)
            extension.lab_debugger.register(shell)
            extension.worker_pdb.register(shell)
        if template.enabled():
            # A notebook that loads nbrpc runs %rpc_init next: the warm template imports
            # torch and ipykernel while the person types, and the first cluster forks from it.
            template.prestart()
        return extension

    @classmethod
    def of(cls, shell=None) -> Extension:
        """The extension loaded in ``shell`` (the running shell by default)."""
        if shell is None:
            from IPython import get_ipython

            shell = get_ipython()
        extension = cls.loaded.get(id(shell))
        if extension is None:
            raise RuntimeError("nbrpc's extension is not loaded: %load_ext nbrpc")
        return extension

    def unload(self) -> None:
        # IPython cannot unregister magics; the cluster, if any, keeps running, and its
        # workers' output goes to stdout and stderr, tagged.
        self.advice.unregister(self.shell)
        self.cell_output.unregister(self.shell)
        self.hang_watch.unregister(self.shell)
        self.panel.unregister(self.shell)
        self.lab_debugger.unregister(self.shell)
        self.worker_pdb.unregister(self.shell)
        self.loaded.pop(id(self.shell), None)
