"""Record every RPC this member makes or serves, inside the call, in a bounded ring.

Each RPC leaves two halves, each written by the member that saw it into its own
bounded ring (``Ring``; the oldest halves go first, and are counted):

- the caller's (``outgoing``, ``sent``, then ``answered``): callee, what ran, when it was sent
  and when the reply arrived, request bytes, the call it was made in (``parent``),
  the autograd context, the RRef, the error. The calls layer writes it for ``rpc_sync``,
  ``rpc_async``, ``remote`` and ``to_here`` (and so for RRef helpers and
  ``DistributedOptimizer.step``, which go through them).
- the callee's (``started``, ``finished``): when a thread began and ended the
  function, which thread, the reply's bytes, the error. ``interrupts.Stoppable``,
  which already wraps every Python function a caller sends, carries the caller's
  call id and writes it.

Recording runs inside every call, so a half is kept as cheaply as it can be taken:
a list (``KEY``, ``T``, ... name its slots) of what the call already holds: the call
id as a number, the destination as given, thread idents, a function's name and kind
looked up once per function. ``report`` turns halves into dicts when someone asks.

Bytes are counted by the pickler (``count``, ``received``): tensor bytes (torch's
tensor table) apart from the pickle around them. ``gradients`` adds the halves of a
backward pass's gradients; ``diagnostics.trace`` gathers every member's ``report``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time

import torch

from .._compat import torch_compat
from . import clocks, functions
from .ring import Ring
from .rref_ledger import rref_id

SETTLE = 0.5  # seconds at most a block's end waits for replies still on their way
# torch's names for the messages that carry what no Python function runs.
GRADIENTS = "BACKWARD_AUTOGRAD_REQ"
FETCH = "RREF_FETCH_CALL"
# A call id: the caller's rank in the top bits, its count of calls below.
RANK_SHIFT = 40
_COUNT_MASK = (1 << RANK_SHIFT) - 1
# The slots of a half, as kept: a list, the cheapest record to build and fill.
# Both sides: the call id, the time it was taken (sent, began), its side, the reply's
# bytes, the error, what ran.
KEY, T, SIDE, REPLY_TENSOR, REPLY_PICKLE, ERROR, NAME = range(7)
# The caller's: the destination as given, the kind of call, the call this one was
# made in, when the reply came, the request's bytes, the autograd context, the RRef,
# and the gradients' halves' own id (they are keyed by autograd message).
TO, KIND, PARENT, REPLIED, REQUEST_TENSOR, REQUEST_PICKLE, CONTEXT, RREF, ID = range(7, 16)
# The callee's: the thread's ident, the recorded call it was running before, the end.
THREAD, OUTER, ENDED = range(7, 10)

_get_ident = threading.get_ident


class Recorder:
    """This member's recording: whether it records, its ring of halves, and what its
    threads are in the middle of. One per process (``RECORDER``), emptied by ``reset``.

    Per-thread state is kept by thread ident. Not threading.local: a torch RPC thread may
    take the GIL with a fresh thread state for each step of a call (its thread-locals
    start empty) until nbrpc keeps its state (``torch_compat.keep_thread_state``).
    """

    def __init__(self):
        self.ids = itertools.count()
        self.reset()

    def reset(self) -> None:
        self.recording = False  # this member writes caller halves (read on every call)
        self.armed = False  # some half may wait for the pickler to count its bytes here
        self.always = False  # the cluster was started with trace=True
        self.blocks = 0  # open ``trace()`` blocks that turned recording on here
        self.me = "?"
        self.quiet: set[int] = set()  # threads whose calls are nbrpc's own
        self.running: dict[int, int | str] = {}  # the recorded call a thread runs (its calls' parent)
        self.sending: dict[int, list] = {}  # the caller half whose request a thread pickles next
        self.fetches: dict[int, list] = {}  # the caller half whose reply a thread unpickles next
        self.replies: dict[int, list] = {}  # the callee half whose result a thread pickles next
        self.threads: dict[int, str] = {}  # thread ident -> its name in records
        self.ring = Ring()


RECORDER = Recorder()
_r = RECORDER


# -- turning it on -----------------------------------------------------------------


def install(always: bool = False) -> None:
    """Record in this member from now on if ``always`` (a cluster started with
    ``trace=True``), else only inside ``trace()`` blocks; after joining."""
    info = torch_compat.current_agent().get_worker_info()
    # The count goes on from cluster to cluster: an id is never reused in a process.
    _r.me, _r.ids = info.name, itertools.count((info.id << RANK_SHIFT) + (next(_r.ids) & _COUNT_MASK))
    _r.always = bool(always)
    _update()


def enable(on: bool = True) -> dict:
    """One ``trace()`` block begins (or ends) here; returns this member's identity."""
    _r.blocks = max(0, _r.blocks + (1 if on else -1))
    _update()
    return identity()


def _update() -> None:
    _r.recording = _r.always or _r.blocks > 0
    if _r.recording:
        _r.armed = True


def identity() -> dict:
    return dict(name=_r.me, pid=os.getpid(), clock=clocks.clock_id())


@contextlib.contextmanager
def quiet():
    """Calls this thread makes inside the block are not recorded (nbrpc's own)."""
    me = _get_ident()
    before = me in _r.quiet
    _r.quiet.add(me)
    try:
        yield
    finally:
        if not before:
            _r.quiet.discard(me)


# -- the caller's half --------------------------------------------------------------


def outgoing(kind: str, to, rref=None, func=None) -> list | None:
    """Start the caller's half of a call about to be sent (None: not recorded): only its
    id and time, so that the call leaves at once; the next pickle this thread writes is
    its request. ``sent`` adds the rest while the message is on its way.
    ``rref``: the RRef a ``to_here`` fetches (its half is complete at once). Not recorded:
    calls of nbrpc's own functions (``functions.own``) and a ``quiet`` thread's calls."""
    me = _get_ident()
    if me in _r.quiet or (func is not None and functions.own(func)):
        return None
    half = [next(_r.ids), clocks.now(), "caller", None, None, None, None,
            to, kind, _r.running.get(me), None, 0, 0, None, None, None]
    if rref is None:
        _r.sending[me] = half
    else:
        half[RREF], half[NAME] = _rref_id(rref), FETCH
        _r.ring.add(half)
    return half


def sent(half: list, func, args) -> None:
    """The rest of a caller half, once its request has left (or failed to): what ran,
    the RRef it uses, what its arguments tell. Off the call's way: the callee is at
    work meanwhile."""
    me = _get_ident()
    if _r.sending.get(me) is half:  # no pickle took it: torch wrote the message itself, or none
        del _r.sending[me]
    found = functions.describe(func)
    half[NAME] = found[0]
    if found[1]:
        half[KIND] = found[1]
    if args:
        for a in args:
            if isinstance(a, torch_compat.PyRRef):  # the RRef the call uses
                half[RREF] = _rref_id(a)
                break
        if found[3]:
            _look_at_arguments(half, func, args, found[2])
    _r.ring.add(half)


def call_id(half: list):
    """The id a recorded call is sent with (``interrupts.Stoppable``'s ``trace``)."""
    return half[KEY]


def made_rref(half: list, rref) -> None:
    """A recorded ``remote`` made ``rref`` (an RRef helper's names the one it used)."""
    if half[KIND] != "rref_helper":
        half[RREF] = _rref_id(rref)


def _look_at_arguments(half: list, func, args, torch_pickles: bool) -> None:
    """What some calls' arguments tell: an RRef helper's method, the optimizer step's
    context, and the tensors of a call torch pickles itself."""
    if func in functions.RREF_HELPERS:
        half[NAME] = functions.helper_name(args[0], args[1])
        return
    if half[KIND] == "internal" and half[NAME].rsplit(".", 1)[-1] in torch_compat.OPTIMIZER_STEPS:
        half[KIND], half[CONTEXT] = "optimizer", args[1]  # DistributedOptimizer.step's, on one owner
    if torch_pickles:
        # torch pickles a builtin's or TorchScript function's arguments itself: count
        # the tensors among them, and look for the context as ``count`` would.
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        half[REQUEST_TENSOR] = _size(tensors)
        if half[CONTEXT] is None and any(a.requires_grad for a in tensors):
            half[CONTEXT] = _context()


def fetching(half: list | None) -> None:
    """The next pickle this thread reads is ``half``'s reply (to_here); None: no longer."""
    if half is None:
        _r.fetches.pop(_get_ident(), None)
    else:
        _r.fetches[_get_ident()] = half


def answered(half: list, error: BaseException | None = None) -> None:
    half[REPLIED] = clocks.now()
    if error is not None:
        half[ERROR] = _error_text(error)


def answered_future(half: list, fut) -> None:
    """Done-callback form of ``answered`` for torch futures."""
    try:
        fut.wait()
    except Exception as e:
        answered(half, e)
    else:
        answered(half)


def named(half: list, error: BaseException) -> None:
    """The call's error as nbrpc names it (it replaces torch's)."""
    half[ERROR] = _error_text(error)


def failed(half: list, error: BaseException) -> None:
    """The call failed before any reply (not sent, or its wait ended in an error)."""
    half[ERROR] = half[ERROR] or _error_text(error)


def _context() -> int | None:
    return torch_compat.context_id_or_none()


def _rref_id(rref) -> str | None:
    try:
        return rref_id(rref)
    except Exception:
        return None


def _error_text(error: BaseException) -> str:
    text = str(error).split("\n\nAt:", 1)[0].strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


# -- the callee's half --------------------------------------------------------------


def add(half: list) -> None:
    """Keep ``half`` in this member's ring (``gradients`` adds the gradients' halves)."""
    _r.ring.add(half)


def new_id() -> int:
    """A call id no other call of this member has."""
    return next(_r.ids)


def this_thread() -> int:
    """This thread's ident, its name remembered for the records."""
    me = _get_ident()
    if me not in _r.threads:
        _r.threads[me] = _thread()
    return me


def started(trace: tuple, func, args) -> list:
    """A thread of this member begins running a recorded call (``Stoppable``)."""
    _r.armed = True
    me = this_thread()
    key = trace[0]
    half = [key, clocks.now(), "callee", None, None, None, None, me, _r.running.get(me), None]
    if func in functions.RREF_HELPERS and args:
        half[NAME] = _callee_helper_name(args[0], args[1])
    _r.running[me] = key
    if _r.replies:  # one whose result never reached the pickler
        _r.replies.pop(me, None)
    _r.ring.add(half)
    return half


def finished(half: list, trace: tuple, error: BaseException | None) -> None:
    half[ENDED] = clocks.now()
    me = _get_ident()
    if half[OUTER] is None:
        _r.running.pop(me, None)
    else:
        _r.running[me] = half[OUTER]
    if error is not None:
        half[ERROR] = _error_text(error)
    elif trace[1]:  # its result is pickled next, on this thread, as the reply
        _r.replies[me] = half


def _callee_helper_name(rref, method: str) -> str:
    try:
        return f"{type(rref.local_value()).__qualname__}.{method}"
    except Exception:
        return f"RRef.{method}"


def _thread() -> str:
    current = threading.current_thread()
    if isinstance(current, threading._DummyThread):  # one of torch's RPC threads
        return f"rpc-thread-{threading.get_native_id()}"
    return current.name


# -- bytes, counted by the pickler ---------------------------------------------------


def count(obj, pickled: int, tensors: list | None = None) -> None:
    """The RPC pickler wrote ``obj`` in ``pickled`` bytes on this thread, with ``tensors``
    beside it (by default the tensor table torch's pickling fills)."""
    me = _get_ident()
    if tensors is None:
        tensors = getattr(torch_compat.tensor_tables, "send_tables", None)
    half = _r.sending.pop(me, None) if _r.sending else None
    if half is not None:
        half[REQUEST_PICKLE] = pickled
        if tensors:
            half[REQUEST_TENSOR] = _size(tensors)
            # As torch does: a message joins the autograd context only with a tensor that
            # requires grad (and finding the context costs an exception when there is none).
            if half[CONTEXT] is None and any(t.requires_grad for t in tensors):
                half[CONTEXT] = _context()
        return
    half = _r.replies.pop(me, None) if _r.replies else None
    if half is not None:
        half[REPLY_TENSOR], half[REPLY_PICKLE] = _size(tensors), pickled


def received(pickled: int) -> None:
    """The RPC unpickler read ``pickled`` bytes on this thread (while ``fetches``)."""
    half = _r.fetches.pop(_get_ident(), None)
    if half is not None:
        tensors = getattr(torch_compat.tensor_tables, "recv_tables", None)
        half[REPLY_TENSOR], half[REPLY_PICKLE] = _size(tensors), pickled


def _size(tensors) -> int:
    """Bytes of ``tensors`` (a list, or None: torch made no tensor table)."""
    return sum(t.element_size() * t.nelement() for t in tensors) if tensors else 0

# -- gathering -----------------------------------------------------------------------


def report(since: float | None = None, offsets: dict | None = None) -> dict:
    """This member's halves from ``since`` (driver's clock) on, in their final form
    (``call_records.merge`` reads them)."""
    info = torch_compat.current_agent().get_worker_info()
    offset = (offsets or {}).get(info.name, 0.0)
    local_since = None if since is None else since - offset - 1.0
    call_id = _CallIds()
    halves = [_final(h, call_id) for h in _r.ring.since(local_since)]
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                clock=clocks.clock_id(), recording=_r.recording, halves=halves,
                evicted=[(t, n) for t, n in list(_r.ring.evicted) if local_since is None or t >= local_since])


def _final(half: list, call_id: _CallIds) -> dict:
    """A half as kept (a list of numbers, idents, the destination as given) as the dict
    ``call_records.merge`` reads."""
    final = {"side": half[SIDE], "key": call_id(half[KEY]), "t": half[T], "error": half[ERROR],
             "reply": None if half[REPLY_PICKLE] is None else [half[REPLY_TENSOR], half[REPLY_PICKLE]]}
    if half[SIDE] == "caller":
        final.update(
            caller=_r.me, callee=functions.destination_name(half[TO]), kind=half[KIND], name=half[NAME], sent=half[T],
            replied=half[REPLIED], request=[half[REQUEST_TENSOR], half[REQUEST_PICKLE]],
            parent=call_id(half[PARENT]), context=half[CONTEXT], rref=half[RREF])
        if half[ID] is not None:  # the gradients' halves: keyed by autograd message
            final["id"] = call_id(half[ID])
    else:
        final.update(member=_r.me, began=half[T], ended=half[ENDED],
                     thread=_r.threads.get(half[THREAD], str(half[THREAD])))
        if half[NAME] is not None:
            final["name"] = half[NAME]
    return final


class _CallIds:
    """``"<caller>:<n>"`` for a call id kept as a number (its caller's rank in the top
    bits); any other key as it is."""

    def __init__(self):
        self.names: dict[int, str] = {}

    def __call__(self, key):
        if not isinstance(key, int):
            return key
        rank = key >> RANK_SHIFT
        if rank not in self.names:
            self.names[rank] = functions.destination_name(rank)
        return f"{self.names[rank]}:{key & _COUNT_MASK}"


def settle(start: float, limit: float = SETTLE) -> None:
    """Wait a little for the replies still on their way to this member's calls since
    ``start``. The owner sends a ``to_here`` its value before it acknowledges the
    ``remote`` that made it, so a block ending in ``to_here`` could otherwise end before
    its ``remote`` was answered (and show it still in flight)."""
    waiting = [h for h in _r.ring.since(start) if h[SIDE] == "caller" and h[KIND] != "autograd"
               and h[REPLIED] is None and h[ERROR] is None]
    deadline = time.monotonic() + limit
    while waiting and time.monotonic() < deadline:
        time.sleep(0.001)
        waiting = [h for h in waiting if h[REPLIED] is None]
