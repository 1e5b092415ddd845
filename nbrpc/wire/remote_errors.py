"""Remote exceptions keep their class: ``except NotebookError:`` works across RPC.

torch re-creates a remote exception on the caller (``torch_compat.handle_exception``) but
does so inside a C++ callback, which turns any class but a few builtins into a
``RuntimeError`` holding its text. The wrapper below keeps each re-created exception
for a moment; ``original`` finds it again from the ``RuntimeError``'s text, so the
caller's wrappers (``calls``) raise the exception itself, of the caller's own class
(a class defined in a cell comes home as the notebook's class, see ``definitions``).

``show_call_error`` shows an error of nbrpc's call wrappers (a timeout, a worker's
death) as the cell's frames and its one message. ``show_in_cell`` shows a remote error
in a kernel's cell: the remote traceback's frames of that kernel's cells read ``Cell
In[N], line L``, as IPython names local frames, and nbrpc's call wrappers are left out.
Both take the kernel's shell as it is (they import no IPython): the notebook's
extension calls them, and a worker's kernel calls ``show_in_cell`` for its own cells.
"""

from __future__ import annotations

import collections
import re
import threading

from .._compat import torch_compat
from ..errors import RpcTimeoutError, SerializationError, UnknownWorkerError, WorkerDiedError

_torch_handle_exception = torch_compat.handle_exception
_KEPT = 256  # exceptions re-created but not yet claimed by a waiting call
_kept: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def install() -> None:
    """Wrap torch's handler; must run before this process's first RPC (idempotent)."""
    torch_compat.patch(torch_compat.HANDLE_EXCEPTION, _handle_exception)


def _handle_exception(result):
    try:
        _torch_handle_exception(result)
    except BaseException as e:
        if isinstance(result, torch_compat.RemoteException) and type(e).__module__ != "builtins":
            with _lock:
                _kept[str(e)] = e
                while len(_kept) > _KEPT:
                    _kept.popitem(last=False)
        raise


# A frame of a remote traceback's text (Python's traceback module wrote it on the worker).
_REMOTE_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')
# torch's text of a remote error (``torch_compat.remote_exception``), after the class name.
_REMOTE_TEXT = re.compile(r"On WorkerInfo\(id=\d+, name=[^)\n]*\):\n")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# nbrpc's call wrappers and torch's RPC API around them: between a cell's call and the error.
_CALL_LAYERS = re.compile(r"[/\\](?:nbrpc[/\\]calls|torch[/\\]distributed[/\\]rpc)[/\\]\w+\.py")
# The C++ stack pybind adds to an error that passed through torch's callbacks ("At:" and
# a line per frame): torch's and nbrpc's handlers, nothing of the user's code.
_CPP_STACK = re.compile(r"\n+At:\n(?:  [^\n]*(?:\n|$))+")
# The errors nbrpc's call wrappers raise: each message says it all.
CALL_ERRORS = (RpcTimeoutError, WorkerDiedError, SerializationError, UnknownWorkerError)


def show_in_cell(shell, etype, value, tb, tb_offset=None) -> list[str] | None:
    """Show ``value``, a remote error, in ``shell``'s cell and return the traceback lines
    shown; None (nothing shown) if it is not one."""
    if not _REMOTE_TEXT.search(str(value)) or hasattr(value, "_render_traceback_"):
        return None
    stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    stb = [cell_frames(shell.compile.format_code_name, entry) for entry in stb
           if not _wrapper_frame(entry)]
    shell._showtraceback(etype, value, stb)
    return stb


def show_call_error(shell, etype, value, tb, tb_offset=None) -> list[str] | None:
    """Show ``value``, an error of nbrpc's call wrappers (a timeout, a worker's death),
    in ``shell``'s cell as the cell's frames and its message, and return the lines shown;
    None (nothing shown) if it is not one. Left out: the frames of nbrpc's wrappers and
    torch's RPC API, and torch's error it was made from (its message quotes it)."""
    if not isinstance(value, CALL_ERRORS):
        return None
    cause, suppress = value.__cause__, value.__suppress_context__
    value.__cause__, value.__suppress_context__ = None, True
    try:
        stb = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    finally:
        value.__cause__, value.__suppress_context__ = cause, suppress
    stb = [entry for entry in stb if not _wrapper_frame(entry)]
    shell._showtraceback(etype, value, stb)
    return stb


def _wrapper_frame(entry: str) -> bool:
    """Whether ``entry`` (of IPython's structured traceback) is a frame of nbrpc's call
    wrappers or torch's RPC API."""
    first = _ANSI.sub("", entry).lstrip().split("\n", 1)[0]
    return first.startswith("File ") and _CALL_LAYERS.search(first) is not None


def cell_frames(cell_name, text: str) -> str:
    """``text`` with each ``File "...", line L`` of a cell that ``cell_name`` (IPython's
    ``format_code_name``) knows written as IPython writes a local frame, ``Cell In[N],
    line L``, and without the frames of nbrpc's wrappers and torch's RPC API (a ``File``
    line and the lines indented under it) or the C++ stacks torch's callbacks add."""
    kept, skipping = [], None
    for line in _CPP_STACK.sub("\n", text).split("\n"):
        indent = len(line) - len(line.lstrip())
        if skipping is not None and indent > skipping:
            continue
        frame = _REMOTE_FRAME.search(line)
        skipping = indent if frame and _CALL_LAYERS.search(frame.group(1)) else None
        if skipping is None:
            kept.append(line)
    text = "\n".join(kept)

    def named(match: re.Match) -> str:
        found = cell_name(match.group(1))
        if found is None:
            return match.group(0)
        label, name = found
        return f"{label} {name}, line {match.group(2)}"

    return _REMOTE_FRAME.sub(named, text)


def original(error: BaseException, take: bool = True) -> BaseException | None:
    """The remote exception that ``error`` (torch's ``RuntimeError``) stands for, if kept
    (and no longer kept, unless ``take`` is false: a look that leaves it for the raise)."""
    if type(error) is not RuntimeError:
        return None
    name, _, message = str(error).split("\n\nAt:", 1)[0].partition(": ")
    with _lock:
        found = _kept.get(message)
        if found is None or type(found).__name__ != name:
            return None
        if take:
            del _kept[message]
    return found
