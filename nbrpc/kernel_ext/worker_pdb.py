"""Debugging across workers from the notebook: the cell's input for members' pdb
prompts, and ``%debug`` after a remote error.

Parts:

- ``CellInput``: how the driver reads a line (``prompts.READERS``): the notebook's
  ``input()``, which ipykernel asks the front end for on the stdin channel of the
  running cell; None where the cell takes no input (nbclient without stdin).
- ``debug``: IPython's ``%debug``, first looking whether the last error came from a
  member (``breakpoints.failure_of``): then pdb opens in that member's frames of the failed
  call (``breakpoints.post_mortem``, over RPC, prompting in this cell); else IPython's own.
"""

from __future__ import annotations

import re
import sys

import torch.distributed.rpc as rpc
from IPython.core.error import StdinNotImplementedError

from ..calls import breakpoints, prompts

# A frame as pdb writes it: "> /tmp/ipykernel_1/123.py(6)stepped()" (``w``: "  " for others).
_PDB_FRAME = re.compile(r"(?m)^([> ] )(\S+?\.py)\((\d+)\)")


class CellInput:
    """The running cell's ``input()`` (see the module's docstring)."""

    def __init__(self, shell):
        self.shell = shell

    def __call__(self, prompt: str) -> str | None:
        try:
            return input(prompt)
        except (StdinNotImplementedError, EOFError):
            return None

    def named(self, text: str) -> str:
        """pdb's ``> file(line)function()`` of this kernel's cells as ``Cell In[N], line L``."""
        def name(match: re.Match) -> str:
            found = self.place(match.group(2), match.group(3))
            return match.group(0) if found is None else f"{match.group(1)}{found}: "

        return _PDB_FRAME.sub(name, text)

    def place(self, file: str, line) -> str | None:
        """``Cell In[N], line L`` for a line of this kernel's cells, else None."""
        found = self.shell.compile.format_code_name(file)
        return None if found is None else f"{found[0]} {found[1]}, line {line}"

    def takes_input(self) -> bool:
        kernel = getattr(self.shell, "kernel", None)
        if kernel is None:  # a terminal IPython: its own stdin
            return sys.stdin is not None and sys.stdin.isatty()
        return bool(kernel.get_parent().get("content", {}).get("allow_stdin", False))


class PostMortem:
    """``%debug`` that opens a member's frames after a remote error."""

    def __init__(self, shell):
        self.shell = shell
        self.ipython_debug = None  # IPython's own %debug

    def debug(self, line: str = "", cell: str | None = None, local_ns=None):
        """%debug: after an error raised on a member, pdb in that member's frames."""
        failure = breakpoints.failure_of(getattr(sys, "last_value", None))
        if failure is None or line.strip() or cell is not None:
            return self.ipython_debug(line, cell, local_ns=local_ns)
        member, call_id = failure
        print(f"nbrpc: {type(sys.last_value).__name__} was raised on {member}: pdb opens in {member}'s "
              "frames of that call")
        rpc.rpc_sync(member, breakpoints.post_mortem, args=(call_id,), timeout=0)
        return None

    debug.needs_local_scope = True


class WorkerPdb:
    """One shell's parts: registered by ``register``, taken back by ``unregister``."""

    def __init__(self, shell):
        self.input = CellInput(shell)
        self.post_mortem = PostMortem(shell)

    def register(self, shell) -> None:
        prompts.READERS.add(self.input)
        magics = shell.magics_manager.magics
        if self.post_mortem.ipython_debug is None and "debug" in magics["line"]:
            # IPython may declare its magics lazily: using one imports and registers it.
            getattr(magics["line"]["debug"], "__name__", None)
            self.post_mortem.ipython_debug = magics["line"]["debug"]
            shell.register_magic_function(self.post_mortem.debug, "line_cell", "debug")

    def unregister(self, shell) -> None:
        prompts.READERS.discard(self.input)
        if self.post_mortem.ipython_debug is not None:  # IPython's own %debug back in place
            shell.magics_manager.magics["line"]["debug"] = self.post_mortem.ipython_debug
            shell.magics_manager.magics["cell"]["debug"] = self.post_mortem.ipython_debug
            self.post_mortem.ipython_debug = None
