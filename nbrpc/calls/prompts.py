"""A member's debugger prompts, asked in the driver's cell that waits on the call.

Parts:

- ``Channel``: pdb's stdin and stdout on a member. What pdb writes gathers there; each
  line it reads is one question to the driver (rank 0, however deep the call: the
  notebook's cell is the root of every chain), the text gathered so far and pdb's
  prompt with the member's name, ``(Pdb) [worker1]``. Sent with torch's own call, past
  nbrpc's wrappers: it is no call that could hang (no timeout: the person may think).
- ``ask``: run on the driver for each question (an ``@async_execution`` function: it
  takes no RPC thread while the person types); the question waits in ``QUESTIONS``.
- ``answer_waiting``: the driver's main thread, while it waits on a call (``rpc_sync``,
  a future's ``wait``, ``to_here``, a ``%%rpc_on`` cell), shows each question's text in
  its cell and reads the answer with ``read_line``. Where nothing can be read (a front
  end that takes no input, a script without a terminal) it says so in one line and
  the member goes on (``NO_INPUT``).
- ``READERS``: how the driver reads a line; the kernel extension registers the
  notebook's ``input()``, which asks the front end on its stdin channel.
"""

from __future__ import annotations

import collections
import linecache
import os
import sys
import threading
import time

import torch

from .._compat import torch_compat
from .._util import Hooks
from . import output

# How often a waiting main thread looks for questions while a person is debugging
# (seconds), and for how long after the last answer it keeps looking that often.
QUICK_POLL = 0.02
QUICK_FOR = 30.0
# Calls whose debugger asked here, remembered for their timeouts: at most this many.
CALLS_LIMIT = 10_000
# What ``read_line`` gets where nothing can be read.
NO_INPUT = None
# What a member's pdb reads when the person interrupted the cell at its prompt.
QUIT = "q"
# ``reader(prompt) -> str | None``: reads a line on the driver's main thread, None if the
# front end takes no input; ``reader.takes_input()``, if defined, says so beforehand, and
# ``reader.named(text)`` writes pdb's text with the driver's cells named, and
# ``reader.place(file, line)`` names one place so (None: not a cell).
READERS = Hooks()


def read_line(prompt: str) -> str | None:
    """A line the person typed at ``prompt``, or None where nothing can be read."""
    for reader in READERS:
        return reader(prompt)
    if sys.stdin is None or not sys.stdin.isatty():
        return NO_INPUT
    try:
        return input(prompt)
    except EOFError:
        return NO_INPUT


def takes_input() -> bool:
    """Whether the driver's running cell can read a line (``read_line``)."""
    for reader in READERS:
        return getattr(reader, "takes_input", lambda: True)()
    return sys.stdin is not None and sys.stdin.isatty()


class Questions:
    """The driver's side: questions from members' debuggers, waiting for the main thread.

    One session at a time: once the person answered a debugger, its questions come first
    and the others wait until it goes on (``continue``, ``quit``) or stays silent for
    ``QUICK_FOR`` s, so that two members' prompts never interleave."""

    def __init__(self):
        self.waiting: collections.deque = collections.deque()  # (session, member, text, prompt, where, fut)
        self.last_answer = 0.0  # time.monotonic() of the last answer
        self.session: str | None = None  # the debugger the person is answering
        self.calls: set[str] = set()  # this member's calls whose callee's debugger asked here

    def put(self, question: tuple) -> None:
        self.waiting.append(question)

    def next(self) -> tuple | None:
        """The question to answer now, taken from the waiting ones, or None."""
        if self.session is not None and time.monotonic() - self.last_answer > QUICK_FOR:
            self.session = None  # a member that went silent (gone) holds nobody up
        for question in list(self.waiting):
            if self.session is None or question[0] == self.session:
                self.waiting.remove(question)
                self.session = question[0]
                return question
        return None

    def ended(self, session: str) -> None:
        if self.session == session:
            self.session = None


QUESTIONS = Questions()


def ask(session: str, member: str, call_id: str | None, text: str, prompt: str,
        where: tuple) -> torch.futures.Future:
    """Run on the driver: a Future of the line the person types after ``text`` at
    ``prompt`` (None where nothing can be read); ``where`` names the stop for the one
    line said then (what stopped, in which function, file, line), ``call_id`` the call
    paused. An ``@async_execution`` function: the main thread sets it."""
    torch_compat.keep_thread_state()
    fut = torch.futures.Future()
    if call_id is not None and len(QUESTIONS.calls) < CALLS_LIMIT:
        QUESTIONS.calls.add(call_id)
    QUESTIONS.put((session, member, text, prompt, where, fut))
    return fut


torch_compat.mark_async_execution(ask)


def ended(session: str) -> None:
    """Run on the driver: debugger ``session`` let its thread go on; others may ask."""
    torch_compat.keep_thread_state()
    QUESTIONS.ended(session)


def asked_for(call_id: str | None) -> bool:
    """Whether the debugger of call ``call_id`` (made here) asked here: its callee paused it."""
    return call_id in QUESTIONS.calls if QUESTIONS.calls else False


def poll_interval(usual: float) -> float:
    """How long a waiting main thread may sleep before it looks for questions again."""
    if QUESTIONS.waiting or time.monotonic() - QUESTIONS.last_answer < QUICK_FOR:
        return QUICK_POLL
    return usual


def answer_waiting() -> None:
    """On the driver's main thread: answer every waiting question (no-op elsewhere)."""
    while QUESTIONS.waiting and threading.get_ident() == threading.main_thread().ident:
        question = QUESTIONS.next()
        if question is None:  # another member's debugger waits for the current one
            return
        _, member, text, prompt, where, fut = question
        try:
            answer = _answer(member, text, prompt, where)
        except BaseException:
            fut.set_result(QUIT)  # the stop button at the prompt: the member's pdb quits
            raise
        QUESTIONS.last_answer = time.monotonic()
        fut.set_result(answer)


def _answer(member: str, text: str, prompt: str, where: tuple) -> str | None:
    if text:
        for reader in READERS:  # the notebook names its cells as IPython does
            text = getattr(reader, "named", lambda t: t)(text)
            break
        sys.stdout.write(text)
        sys.stdout.flush()
    answer = read_line(prompt)
    if answer is NO_INPUT:
        what, function, file, line = where
        print(f"[{member}] {what} in {function} ({place(file, line)}): no debugger prompt, since this "
              "front end takes no input; the call goes on (run the cell in JupyterLab or Notebook to "
              "step through it)", file=sys.stderr)
    return answer


def place(file: str, line: int) -> str:
    """``file``, ``line`` in words: a notebook cell as IPython names it (``Cell In[N], line
    L``), else the file's name."""
    for reader in READERS:
        found = getattr(reader, "place", lambda f, n: None)(file, line)
        if found:
            return found
        break
    return f"{os.path.basename(file)}, line {line}"


def sources(files: list[str]) -> dict[str, list[str]]:
    """Run on the driver: the lines of each of ``files`` it knows (its cells), for a
    member's debugger to list."""
    found = {}
    for file in files:
        lines = linecache.getlines(file)
        if lines:
            found[file] = lines
    return found


class Channel:
    """pdb's stdin and stdout on a member: each line read is a question to the driver."""

    def __init__(self, member: str, call_id: str | None, where: tuple):
        self.member, self.call_id, self.where = member, call_id, where
        self.session = f"{member}:{os.getpid()}:{id(self)}"
        self._written: list[str] = []
        self.answered = False  # the person answered at least once (else: no input)
        self.open = False  # a question was asked since the session last ended

    def write(self, text: str) -> int:
        self._written.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        text, self._written = "".join(self._written), []
        body, newline, prompt = text.rpartition("\n")
        prompt = f"{prompt.rstrip() or '(Pdb)'} [{self.member}] "
        output.before_call()  # what the call printed shows before pdb's prompt
        self.open = True
        fut = torch_compat.invoke_rpc(0, ask, torch_compat.RPCExecMode.ASYNC,
                                      (self.session, self.member, self.call_id, body + newline, prompt, self.where),
                                      None, 0)
        answer = fut.wait()
        if answer is NO_INPUT:
            return "c\n" if not self.answered else "q\n"
        self.answered = True
        return answer + "\n"

    def end_session(self) -> None:
        """pdb lets the thread go on: the driver may take other members' questions."""
        if not self.open:
            return
        self.open = False
        try:
            torch_compat.invoke_rpc(0, ended, torch_compat.RPCExecMode.ASYNC, (self.session,), None, 10.0)
        except RuntimeError:  # the driver is leaving
            pass


def fetch_sources(files: set[str]) -> None:
    """Put the driver's lines of ``files`` (its cells) that this member lacks in its
    ``linecache``, so that pdb lists them."""
    missing = sorted(f for f in files if not linecache.getlines(f))
    if not missing:
        return
    try:
        found = torch_compat.invoke_rpc(0, sources, torch_compat.RPCExecMode.SYNC, (missing,), None, 10.0).wait()
    except RuntimeError:  # the driver is leaving: pdb lists nothing
        return
    for file, lines in found.items():
        # No modification time: linecache.checkcache keeps an entry without one.
        linecache.cache[file] = (sum(map(len, lines)), None, lines, file)
