"""What a student sees when a cell uses torch's RPC before ``%rpc_init``.

torch says "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.":
right in a script, wrong in a notebook, where ``%rpc_init`` starts RPC (and the workers).
``RpcAdvice`` is an IPython custom exception handler: that error becomes one line
saying to run ``%rpc_init`` first. An error raised on a worker carries the worker's
traceback as text (torch sends it so); a frame of that text in one of this kernel's
cells reads ``Cell In[N], line L`` there, as IPython names local frames, and nbrpc's
own call wrappers leave the local part. Every other error shows as it would have (its
own ``_render_traceback_``, or IPython's traceback).
"""

from __future__ import annotations

import re

from ..errors import RUN_RPC_INIT, not_initialized

# A frame of a remote traceback's text (Python's traceback module wrote it on the worker).
_REMOTE_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')
# torch's text of a remote error (``torch_compat.remote_exception``), after the class name.
_REMOTE_TEXT = re.compile(r"On WorkerInfo\(id=\d+, name=[^)\n]*\):\n")
# nbrpc's call wrappers (here and in the worker's text): their frames say nothing of the user's code.
_WRAPPERS = re.compile(r"[/\\]nbrpc[/\\]calls[/\\]\w+\.py")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class RpcAdvice:
    """Registered on a shell by ``register``; ``unregister`` gives the handler slot back."""

    def __init__(self):
        self._shell = None
        self._before = None

    def register(self, shell) -> None:
        if shell.custom_exceptions:  # someone else's handler: leave it in place
            return
        self._shell = shell
        # Exception, not RuntimeError alone: a remote error comes home of its own class.
        shell.set_custom_exc((Exception,), self.handle)

    def unregister(self, shell) -> None:
        if self._shell is shell:
            shell.set_custom_exc((), None)
            self._shell = None

    @staticmethod
    def handle(shell, etype, value, tb, tb_offset=None):
        """Show ``value`` in one line if it is torch's "not initialized", else as usual."""
        if not_initialized(value):
            line = f"\x1b[31mRuntimeError\x1b[0m: {RUN_RPC_INIT}"
            shell._showtraceback(etype, RuntimeError(RUN_RPC_INIT), [line])
            return [line]
        if _REMOTE_TEXT.search(str(value)) and not hasattr(value, "_render_traceback_"):
            stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
            stb = [cell_frames(shell.compile, entry) for entry in stb if not _wrapper_frame(entry)]
            shell._showtraceback(etype, value, stb)
            return stb
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        return None


def _wrapper_frame(entry: str) -> bool:
    """Whether ``entry`` (of IPython's structured traceback) is a frame of nbrpc's wrappers."""
    first = _ANSI.sub("", entry).lstrip().split("\n", 1)[0]
    return first.startswith("File ") and _WRAPPERS.search(first) is not None


def cell_frames(compiler, text: str) -> str:
    """``text`` with each ``File "...", line L`` of one of ``compiler``'s cells written as
    IPython writes a local frame, ``Cell In[N], line L``, and without the frames of
    nbrpc's wrappers (each a ``File`` line and the lines indented under it)."""
    kept, skipping = [], None
    for line in text.split("\n"):
        indent = len(line) - len(line.lstrip())
        if skipping is not None and indent > skipping:
            continue
        frame = _REMOTE_FRAME.search(line)
        skipping = indent if frame and _WRAPPERS.search(frame.group(1)) else None
        if skipping is None:
            kept.append(line)
    text = "\n".join(kept)

    def named(match: re.Match) -> str:
        found = compiler.format_code_name(match.group(1))
        if found is None:
            return match.group(0)
        label, name = found
        return f"{label} {name}, line {match.group(2)}"

    return _REMOTE_FRAME.sub(named, text)
