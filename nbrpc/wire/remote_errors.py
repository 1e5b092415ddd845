"""Remote exceptions keep their class: ``except NotebookError:`` works across RPC.

torch re-creates a remote exception on the caller (``torch_compat.handle_exception``) but
does so inside a C++ callback, which turns any class but a few builtins into a
``RuntimeError`` holding its text. A failed call's reply carries, in place of the class,
``recreated`` with the class (``recreating``, as a member pickles the reply): torch's
handler calls it to make the exception, which it keeps for a moment; ``original`` finds
it again from the ``RuntimeError``'s text, so the caller's wrappers (``calls``) raise the
exception itself, of the caller's own class (a class defined in a cell comes home as the
notebook's class, see ``definitions``). torch's handler raises it from its own frame,
as in a script: no frame of nbrpc's is under it.

``show_call_error`` shows an error of nbrpc's call wrappers (a timeout, a worker's
death) as the cell's frames and its one message. ``show_in_cell`` shows a remote error
in a kernel's cell: the remote traceback's frames of that kernel's cells read ``Cell
In[N], line L``, as IPython names local frames, and nbrpc's call wrappers are left out.
Both take the kernel's shell as it is (they import no IPython): the notebook's
extension calls them, and a worker's kernel calls ``show_in_cell`` for its own cells.

``reply`` makes the member's answer for a call that raised: torch's text (``On
WorkerInfo(...)``, the error, its traceback) with the user's frames and none of
nbrpc's; an error that passes on a nested call's remote error folds into it, so that
a chain across members reads as one traceback, root cause first. ``tidy`` leaves out
what nbrpc and torch's callbacks add on the caller's side (their frames, C++ stacks);
``without_our_frames`` leaves nbrpc's frames out of a traceback a caller gets.
"""

from __future__ import annotations

import collections
import functools
import os
import re
import sys
import threading
import traceback
import types

from .._compat import torch_compat
from ..errors import RpcTimeoutError, SerializationError, UnknownWorkerError, WorkerDiedError, with_torch_class

_UNCLAIMED_LIMIT = 256
# Exceptions re-created (by their text) but not yet claimed by a waiting call.
_unclaimed: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def recreating(reply):
    """``reply``, a ``RemoteException`` this member sends, with ``recreated`` and its class
    in the class's place (once)."""
    made = reply.exception_type
    if isinstance(made, functools.partial) and made.func is recreated:
        return reply
    return torch_compat.RemoteException(reply.msg, functools.partial(recreated, made))


def recreated(cls: type, message: str) -> BaseException:
    """``cls(message)``, what torch's handler raises on the caller; kept (tidied) for
    ``original`` when torch's C++ will raise a ``RuntimeError`` in its place."""
    error = cls(message)
    if type(error).__module__ != "builtins":
        tidy(error)
        with _lock:
            _unclaimed[str(error)] = error
            while len(_unclaimed) > _UNCLAIMED_LIMIT:
                _unclaimed.popitem(last=False)
    return error


# A frame of a remote traceback's text (Python's traceback module wrote it on the worker).
_REMOTE_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')
# torch's text of a remote error (``torch_compat.remote_exception``), after the class name.
_REMOTE_TEXT = re.compile(r"On WorkerInfo\(id=\d+, name=[^)\n]*\):\n")
# nbrpc's own source files (a frame there is nbrpc's, not the user's).
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# A frame of nbrpc's in a text from another member (its install may be elsewhere).
_NBRPC_FRAME = re.compile(r"[/\\]nbrpc[/\\](?:calls|wire|_compat|recording|group|member)[/\\]\w+\.py$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# nbrpc's call wrappers and torch's RPC API around them: between a cell's call and the
# error (any other frame of nbrpc's too: ``_OURS``).
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
    return first.startswith("File ") and (_OURS in first or _CALL_LAYERS.search(first) is not None)


def cell_frames(cell_name, text: str) -> str:
    """``text`` with each ``File "...", line L`` of a cell that ``cell_name`` (IPython's
    ``format_code_name``) knows written as IPython writes a local frame, ``Cell In[N],
    line L``, and without the frames of nbrpc's wrappers and torch's RPC API (a ``File``
    line and the lines indented under it) or the C++ stacks torch's callbacks add."""
    text = _without_frames(text, _call_layer)

    def named(match: re.Match) -> str:
        found = cell_name(match.group(1))
        if found is None:
            return match.group(0)
        label, name = found
        return f"{label} {name}, line {match.group(2)}"

    return _REMOTE_FRAME.sub(named, text)


def _call_layer(filename: str) -> bool:
    """Whether ``filename`` is nbrpc's or torch's RPC API's (not the user's)."""
    return _ours(filename) or _CALL_LAYERS.search(filename) is not None


def _ours(filename: str) -> bool:
    """Whether ``filename`` is one of nbrpc's (here, or on a member installed elsewhere)."""
    return filename.startswith(_OURS) or _NBRPC_FRAME.search(filename) is not None


def without_our_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without the entries of nbrpc's frames (torch's and the user's kept): what a
    wrapper of torch's call sets on the error it passes on before a bare ``raise``, which
    adds no entry for its own frame, so that the caller's frame comes next, as in a script."""
    kept = []
    while tb is not None:
        if not _ours(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    made = None
    for entry in reversed(kept):
        made = types.TracebackType(made, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return made


def original(error: BaseException, take: bool = True) -> BaseException | None:
    """The remote exception that ``error`` (torch's ``RuntimeError``) stands for, if kept
    (and no longer kept, unless ``take`` is false: a look that leaves it for the raise)."""
    if type(error) is not RuntimeError:
        return None
    name, _, message = str(error).split("\n\nAt:", 1)[0].partition(": ")
    message = tidy_text(message)
    with _lock:
        found = _unclaimed.get(message)
        if found is None or type(found).__name__ != name:
            return None
        if take:
            del _unclaimed[message]
    return with_torch_class(found)  # also the RuntimeError torch raised in its place


# -- the texts of remote errors -------------------------------------------------------

_TRACEBACK = "Traceback (most recent call last):"
# A member's name over its frames in a folded chain: ``  On WorkerInfo(...):``.
_MEMBER_LINE = re.compile(r"  On WorkerInfo\(id=\d+, name=[^)\n]*\):$")


def reply(error: BaseException, show: bool = True):
    """What torch's ``_run_function`` makes of an error a served call raised (see
    ``torch_compat.remote_exception``): the text (``remote_text``) printed to stderr
    unless not ``show``, and the ``RemoteException`` torch sends as the reply."""
    text = remote_text(error, str(torch_compat.current_agent().get_worker_info()))
    if show:
        print(text, file=sys.stderr)
    return torch_compat.RemoteException(text, type(error))


def remote_text(error: BaseException, where: str) -> str:
    """torch's text of ``error`` raised on member ``where`` (``WorkerInfo(...)``): ``On
    where:``, its repr, its traceback; without nbrpc's frames, and without the cause of
    an error of nbrpc's call wrappers (its message quotes torch's). An error that passes
    on a nested call's remote error is that error's text, with ``where``'s frames
    above the root cause's in one traceback (each member's frames under its name)."""
    inner = _remote_text_in(error)
    if inner is None:
        body = "".join(_without_our_frames(error).format())
        return f"On {where}:\n{error!r}\n{body}"
    head, frames, tail = _split(inner)
    here = "".join(traceback.format_list(_user_frames(error.__traceback__)))
    return f"{head}{_TRACEBACK}\n  On {where}:\n{here}{frames}{tail}"


def _remote_text_in(error: BaseException) -> str | None:
    """The remote error's text, if ``error`` is a remote error (a nested call's, passed on
    as it came: an error raised while handling one is told with it as its context)."""
    text = str(error)
    found = _REMOTE_TEXT.search(text)
    return None if found is None else tidy_text(text[found.start():])


def _split(text: str) -> tuple[str, str, str]:
    """A remote error's text as its head (``On ...:`` and the error), the frames of its
    last traceback (each member's under its name) and the rest (the error's last lines)."""
    lines = text.split("\n")
    at = max((i for i, line in enumerate(lines) if line == _TRACEBACK), default=None)
    if at is None:
        return text.rstrip("\n") + "\n", "", ""
    end = at + 1
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    frames = lines[at + 1:end]
    if not frames or not _MEMBER_LINE.match(frames[0]):
        frames.insert(0, "  " + lines[0])  # the root cause's member (the head's first line)
    head, rest = "\n".join(lines[:at]), "\n".join(lines[end:])
    return head + "\n", "\n".join(frames) + "\n", rest


def _user_frames(tb) -> traceback.StackSummary:
    return traceback.StackSummary.from_list(
        [frame for frame in traceback.extract_tb(tb) if not _ours(frame.filename)])


def _without_our_frames(error: BaseException) -> traceback.TracebackException:
    """``error`` to format, its chain included, without nbrpc's frames; an error of
    nbrpc's call wrappers without its cause (its message quotes it)."""
    shown = traceback.TracebackException(type(error), error, error.__traceback__)
    seen, part = set(), shown
    while part is not None and id(part) not in seen:
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if not _ours(f.filename)])
        if issubclass(part.exc_type, CALL_ERRORS):
            part.__cause__, part.__context__ = None, None
        part = part.__cause__ or (None if part.__suppress_context__ else part.__context__)
    return shown


def tidy_text(text: str) -> str:
    """A remote error's text without the C++ stacks torch's callbacks add and without
    frames of nbrpc's (a ``File`` line and the lines indented under it)."""
    return _without_frames(text, _ours).rstrip("\n")


def _without_frames(text: str, dropped) -> str:
    """``text`` without torch's C++ stacks and without each frame whose file ``dropped``
    says to leave out (its ``File`` line and the lines indented under it)."""
    kept, skipping = [], None
    for line in _CPP_STACK.sub("\n", text).split("\n"):
        indent = len(line) - len(line.lstrip())
        if skipping is not None and indent > skipping:
            continue
        frame = _REMOTE_FRAME.search(line)
        skipping = indent if frame and dropped(frame.group(1)) else None
        if skipping is None:
            kept.append(line)
    return "\n".join(kept)


def tidy(error: BaseException) -> BaseException:
    """``error`` (a remote error, as torch re-created it here) with its text tidied
    (``tidy_text``) in place; any other error as it is."""
    args = error.args
    if len(args) == 1 and isinstance(args[0], str) and _REMOTE_TEXT.search(args[0]):
        tidied = tidy_text(args[0])
        if tidied != args[0]:
            error.args = (tidied,)
    return error
