"""What a worker writes, shown where the call was made: in the driver's running cell.

Parts:

- ``begin`` / ``end``: ``interrupts.Stoppable`` marks the thread serving a call with
  them; ``end`` sends what waits before the call's reply leaves, so a call's output
  reaches the driver before its caller can go on.
- ``take(piece)``: a worker's stdout and stderr (``member.streams``) offer each write
  here. It is taken from a thread serving a call, and from any thread while no cell
  runs on the worker's kernel (``set_kernel_busy``); the kernel publishes the rest
  itself, which is what ``%%rpc_on`` shows.
- the outbox: pieces in the order they were written. ``send`` hands them to the
  driver (rank 0, however deep the call that wrote them) in one RPC, one batch at a
  time, so each worker's output arrives in order; a flusher thread sends what
  waits every ``FLUSH_INTERVAL`` s (long calls, background threads).
- ``deliver``: runs on the driver for each batch and hands it to the sink
  (``SINKS``): tagged text on the driver's stdout and stderr by default; the
  kernel extension puts it in the running cell, or holds it for the next one.
- ``LineTagger``: prefixes each complete line (or ``\\r``-ended segment: progress
  bars) with the worker's name, holding a partial line back.

A piece is ``("stream", name, text)``, ``("display", data, metadata, transient,
update)`` or ``("clear", wait)``; a batch ``(worker, pieces, final)``, where
``final`` says the call that wrote it has ended (partial lines may be shown).
"""

from __future__ import annotations

import re
import sys
import threading
import time

from .._compat import torch_compat
from .._util import Hooks

# How long written output may wait before the flusher sends it (seconds); ipykernel's
# own stream waits 0.2 s.
FLUSH_INTERVAL = 0.1
# How long a worker waits for the driver to take a batch (seconds).
SEND_TIMEOUT = 10.0



class Outbox:
    """A worker's side: what waits to be sent to the driver, in the order it was
    written, and whether (and as whom) this member routes its output. One per process."""

    def __init__(self):
        self.local = threading.local()  # the depth of calls this thread serves
        self.lock = threading.Lock()  # guards pieces
        self.send_lock = threading.Lock()  # one batch in flight: a worker's output keeps its order
        self.pieces: list[tuple] = []
        self.wake = threading.Event()
        self.name: str | None = None  # this member's name once it routes output (a worker)
        self.kernel_busy = False


_box = Outbox()


def begin() -> None:
    """This thread serves a call from now on (``Stoppable``)."""
    _box.local.depth = getattr(_box.local, "depth", 0) + 1


def end() -> None:
    """This thread's call ended: send what waits, before the reply leaves."""
    _box.local.depth -= 1
    if _box.pieces:
        send(final=True)


def before_call() -> None:
    """This member is about to make a call: what it wrote before shows before what
    the callee writes (a worker calling another)."""
    if _box.pieces:
        send()


def serving() -> bool:
    return getattr(_box.local, "depth", 0) > 0


def set_kernel_busy(busy: bool) -> None:
    """Whether the worker's kernel runs a cell (``%%rpc_on``): writes from threads not
    serving a call then go to that cell through the kernel."""
    _box.kernel_busy = busy


def take(piece: tuple) -> bool:
    """Take ``piece`` for the driver if this member routes output and the writing
    thread serves a call or no cell runs here; False: the kernel publishes it."""
    if _box.name is None or (_box.kernel_busy and not serving()):
        return False
    with _box.lock:
        _box.pieces.append(piece)
    _box.wake.set()
    return True


def route(name: str) -> None:
    """Route this worker's output to the driver from now on, as worker ``name``; a batch
    the driver could not take (it left) goes to ``UNDELIVERED``'s newest hook."""
    if _box.name is None:
        threading.Thread(target=_flush_forever, name="nbrpc-output", daemon=True).start()
    _box.name = name


def stop_routing() -> None:
    """Send what waits, then let the kernel publish everything (leaving the group)."""
    if _box.name is not None:
        send(final=True)
        _box.name = None


def send(final: bool = False) -> None:
    """Hand every waiting piece to the driver in one call."""
    with _box.send_lock:
        with _box.lock:
            pieces = _box.pieces[:]
            del _box.pieces[:]
        if not pieces:
            return
        if _box.name is None:  # no longer routing (leaving): the kernel's clients still listen
            _undelivered(pieces)
            return
        try:
            fut = torch_compat.invoke_rpc(0, deliver, torch_compat.RPCExecMode.SYNC,
                                          (_box.name, pieces, final), None, SEND_TIMEOUT)
            fut.wait()
        except Exception:  # the driver is gone or leaving: its kernel's clients still listen
            _undelivered(pieces)


def _undelivered(pieces: list[tuple]) -> None:
    for publish in UNDELIVERED:
        publish(pieces)
        return


def _flush_forever() -> None:
    torch_compat.keep_thread_state()
    while True:
        _box.wake.wait()
        _box.wake.clear()
        # Let a burst of writes (a print is several) gather into one batch.
        time.sleep(FLUSH_INTERVAL)
        send()


# -- the driver's side ---------------------------------------------------------------


class LineTagger:
    """Prefix each complete line of one worker with ``[worker]``; hold a partial line
    back until it ends or ``flush``. A line ends at ``\\n``, or at ``\\r`` (a
    progress bar redrawing its line keeps its tag)."""

    _END = re.compile(r"\r\n|\n|\r(?!\Z)")

    def __init__(self, worker: str, output):
        self.worker, self.output, self.pending = worker, output, {}

    def feed(self, name: str, text: str) -> None:
        text = self.pending.pop(name, "") + text
        parts, start = [], 0
        for m in self._END.finditer(text):
            line, start = text[start:m.start()], m.end()
            if line or m.group() != "\r":
                parts.append(f"[{self.worker}] {line}{m.group()}")
        if start < len(text):
            self.pending[name] = text[start:]
        if parts:
            self.output.stream(self.worker, name, "".join(parts))

    def flush(self) -> None:
        for name, text in self.pending.items():
            self.output.stream(self.worker, name, f"[{self.worker}] {text.rstrip(chr(13))}\n")
        self.pending.clear()


class PrintOutput:
    """Worker output as text on this process's stdout and stderr (scripts, terminals)."""

    def stream(self, worker: str, name: str, text: str) -> None:
        out = sys.stderr if name == "stderr" else sys.stdout
        out.write(text)
        out.flush()

    def display(self, worker: str, data: dict, metadata: dict, transient: dict | None = None,
                update: bool = False) -> None:
        print(f"[{worker}] {data.get('text/plain', '')}")

    def clear(self, worker: str, wait: bool) -> None:
        pass


class Shown:
    """Batches shown through an output: one ``LineTagger`` per worker."""

    def __init__(self, output):
        self.output = output
        self.taggers: dict[str, LineTagger] = {}

    def show(self, worker: str, pieces: list[tuple], final: bool) -> None:
        tagger = self.taggers.get(worker)
        if tagger is None:
            tagger = self.taggers[worker] = LineTagger(worker, self.output)
        for piece in pieces:
            if piece[0] == "stream":
                tagger.feed(piece[1], piece[2])
            elif piece[0] == "display":  # data, metadata, transient, update
                tagger.flush()
                self.output.display(worker, *piece[1:])
            elif piece[0] == "clear":  # wait
                tagger.flush()
                self.output.clear(worker, piece[1])
        if final:
            tagger.flush()

    def flush(self) -> None:
        for tagger in self.taggers.values():
            tagger.flush()


_default = Shown(PrintOutput())
# Where the driver puts its workers' output (``sink(worker, pieces, final)``): the newest
# registered (the kernel extension's), else tagged text on stdout and stderr.
SINKS = Hooks()
# Where a worker publishes a batch the driver could not take (``publish(pieces)``): its
# kernel's own channels, which the member layer registers as it routes output.
UNDELIVERED = Hooks()


def deliver(worker: str, pieces: list[tuple], final: bool) -> None:
    """Run on the driver: a batch of what ``worker`` wrote."""
    torch_compat.keep_thread_state()
    for sink in SINKS:
        sink(worker, pieces, final)
        return
    _default.show(worker, pieces, final)
