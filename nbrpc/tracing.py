"""Record every RPC on every member, and join the records into one timeline.

Each RPC leaves two halves, each written by the member that saw it into its own
bounded ring (``Ring``; the oldest halves go first, and are counted):

- the caller's (``outgoing``, ``sent``, then ``answered``): callee, what ran, when it was sent
  and when the reply arrived, request bytes, the call it was made in (``parent``),
  the autograd context, the RRef, the error. ``calls`` writes it for ``rpc_sync``,
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
tensor table) apart from the pickle around them. A backward pass's gradients
travel in C++ messages no Python sees; hooks on the ``RecvRpcBackward`` (the
sender, in the backward direction) and ``SendRpcBackward`` (the receiver)
functions of a context, paired by autograd message id, stand for them.

``gather`` asks every member for its halves in parallel; ``records.merge`` joins
them by call id into ``CallRecord`` s on the driver's clock (see ``clocks``).
``trace()`` records a block, ``trace_snapshot`` reads a cluster started with
``trace=True``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import os
import socket
import threading
import time
import types
from pathlib import Path

import torch

from . import clocks, records, torch_compat
from .schemas import TraceSnapshot

__all__ = ["Trace", "trace", "trace_snapshot"]

CAPACITY = 20_000  # halves kept per member
CONTEXTS_KEPT = 64  # autograd contexts whose hooks are remembered per member
DESCRIPTIONS_KEPT = 4096  # functions whose name and kind are remembered per member
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

# Read on every call: plain module globals.
recording = False  # this member writes caller halves
armed = False  # some half may wait for the pickler to count its bytes here
_always = False  # the cluster was started with trace=True
_blocks = 0  # open ``trace()`` blocks that turned recording on here
_me = "?"
_ids = itertools.count()
_get_ident = threading.get_ident
# Per-thread state, by thread ident. Not threading.local: a torch RPC thread may take
# the GIL with a fresh thread state for each step of a call (its thread-locals start
# empty) until nbrpc keeps its state (``torch_compat.keep_thread_state``).
_quiet: set[int] = set()  # threads whose calls are nbrpc's own
_running: dict[int, int | str] = {}  # the recorded call a thread runs (its calls' parent)
_sending: dict[int, list] = {}  # the caller half whose request a thread pickles next
fetches: dict[int, list] = {}  # the caller half whose reply a thread unpickles next
_replies: dict[int, list] = {}  # the callee half whose result a thread pickles next
_threads: dict[int, str] = {}  # thread ident -> its name in records
# ``_description`` per function, by code object for Python functions.
_descriptions: dict = {}


class Ring:
    """The last ``capacity`` halves of this member (lists whose slot ``T`` is their
    time), and how many were evicted when: ``evicted`` holds ``[time, count]`` per ``BUCKET``
    seconds (bounded too)."""

    BUCKET = 0.01

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.halves: collections.deque = collections.deque(maxlen=capacity)
        self.evicted: collections.deque = collections.deque(maxlen=capacity)

    def add(self, half: list) -> None:
        if len(self.halves) == self.capacity:
            self._evict()
        self.halves.append(half)

    def _evict(self) -> None:
        t = self.halves[0][T]
        evicted = self.evicted
        if evicted and t - evicted[-1][0] < self.BUCKET:
            evicted[-1][1] += 1
        else:
            evicted.append([t, 1])

    def since(self, start: float | None) -> list[list]:
        return [h for h in list(self.halves) if start is None or h[T] >= start]

    def dropped(self, start: float, end: float) -> int:
        return sum(n for t, n in list(self.evicted) if start <= t <= end)


_ring = Ring()


# -- turning it on -----------------------------------------------------------------


def install(always: bool = False) -> None:
    """Record in this member from now on if ``always`` (a cluster started with
    ``trace=True``), else only inside ``trace()`` blocks; after joining."""
    global _always, _me, _ids
    info = torch_compat.current_agent().get_worker_info()
    # The count goes on from cluster to cluster: an id is never reused in a process.
    _me, _ids = info.name, itertools.count((info.id << RANK_SHIFT) + (next(_ids) & _COUNT_MASK))
    clocks.set_skew()
    _always = bool(always)
    _update()


def enable(on: bool = True) -> dict:
    """One ``trace()`` block begins (or ends) here; returns this member's identity."""
    global _blocks
    _blocks = max(0, _blocks + (1 if on else -1))
    _update()
    return identity()


def _update() -> None:
    global recording, armed
    recording = _always or _blocks > 0
    if recording:
        armed = True


def set_capacity(capacity: int) -> None:
    """Keep ``capacity`` halves in this member (emptying its ring)."""
    global _ring
    _ring = Ring(capacity)


def identity() -> dict:
    return dict(name=_me, pid=os.getpid(), clock=clocks.clock_id())


@contextlib.contextmanager
def quiet():
    """Calls this thread makes inside the block are not recorded (nbrpc's own)."""
    me = _get_ident()
    before = me in _quiet
    _quiet.add(me)
    try:
        yield
    finally:
        if not before:
            _quiet.discard(me)


# -- the caller's half --------------------------------------------------------------


def outgoing(kind: str, to, rref=None) -> list | None:
    """Start the caller's half of a call about to be sent (None: not recorded): only its
    id and time, so that the call leaves at once; the next pickle this thread writes is
    its request. ``sent`` adds the rest while the message is on its way.
    ``rref``: the RRef a ``to_here`` fetches (its half is complete at once)."""
    me = _get_ident()
    if me in _quiet:
        return None
    half = [next(_ids), clocks.now(), "caller", None, None, None, None,
            to, kind, _running.get(me), None, 0, 0, None, None, None]
    if rref is None:
        _sending[me] = half
    else:
        half[RREF], half[NAME] = _rref_id(rref), FETCH
        _ring.add(half)
    return half


def sent(half: list, func, args) -> None:
    """The rest of a caller half, once its request has left (or failed to): what ran,
    the RRef it uses, what its arguments tell. Off the call's way: the callee is at
    work meanwhile."""
    me = _get_ident()
    if _sending.get(me) is half:  # no pickle took it: torch wrote the message itself, or none
        del _sending[me]
    try:
        found = _descriptions.get(getattr(func, "__code__", func))
    except TypeError:  # a callable object that cannot be a dict key
        found = None
    if found is None or found[4] != getattr(func, "__qualname__", None):
        found = _description(func)
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
    _ring.add(half)


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
    if func in _HELPERS:
        half[NAME] = _helper_name(args[0], args[1])
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
        fetches.pop(_get_ident(), None)
    else:
        fetches[_get_ident()] = half


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


def failed(half: list, error: BaseException) -> None:
    """The call failed before any reply (not sent, or its wait ended in an error)."""
    half[ERROR] = half[ERROR] or _error_text(error)


def _description(func) -> tuple[str, str | None, bool, bool, str | None]:
    """``_describe(func)`` and the ``__qualname__`` it was made for, remembered for the
    next calls: by code object for a Python function (a closure made anew for each
    call shares it, and is not kept alive by it; functions that share a decorator's
    code differ in name), by itself for a class, builtin or TorchScript function."""
    found = (*_describe(func), getattr(func, "__qualname__", None))
    key = getattr(func, "__code__", None)
    if key is None and isinstance(func, _LASTING):
        key = func
    if key is not None and found[4] is not None:
        if len(_descriptions) >= DESCRIPTIONS_KEPT:
            _descriptions.clear()
        _descriptions[key] = found
    return found


def _describe(func) -> tuple[str, str | None, bool, bool]:
    """Name of ``func``, the kind of call it makes if special, whether torch pickles
    the arguments itself (a builtin, a TorchScript function), and whether its
    arguments say more (``_look_at_arguments``)."""
    builtin = torch_compat.find_builtin(func)
    if builtin is not None:
        return builtin, None, True, True
    if func in _HELPERS:
        return "", "rref_helper", False, True  # named per call, by the RRef's type and method
    if isinstance(func, torch.jit.ScriptFunction):  # "__torch__.module.name"
        name = func.qualified_name
        return name.removeprefix("__torch__."), _internal(name), True, True
    name = getattr(func, "__qualname__", None) or repr(func)
    kind = _internal(getattr(func, "__module__", None) or "")
    return name, kind, False, kind is not None


def _internal(module: str) -> str | None:
    """torch's own functions (``_rref_typeof_on_owner``...) make internal calls."""
    return "internal" if module.removeprefix("__torch__.").startswith("torch.distributed") else None


def _helper_name(rref, method: str) -> str:
    try:
        return f"{torch_compat.rref_type(rref).__qualname__}.{method}"
    except Exception:
        return f"RRef.{method}"


def _name(to) -> str:
    if isinstance(to, str):
        return to
    if hasattr(to, "name"):
        return to.name
    try:
        return torch_compat.current_agent().get_worker_info(to).name
    except Exception:
        return str(to)


def _context() -> int | None:
    try:
        return torch_compat.current_context_id()
    except RuntimeError:
        return None


def _rref_id(rref) -> str | None:
    from .rref_ledger import rref_id

    try:
        return rref_id(rref)
    except Exception:
        return None


def _error_text(error: BaseException) -> str:
    text = str(error).split("\n\nAt:", 1)[0].strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


# -- the callee's half --------------------------------------------------------------


def started(trace: tuple, func, args) -> list:
    """A thread of this member begins running a recorded call (``Stoppable``)."""
    global armed
    armed = True
    me = _get_ident()
    if me not in _threads:
        _threads[me] = _thread()
    key = trace[0]
    half = [key, clocks.now(), "callee", None, None, None, None, me, _running.get(me), None]
    if func in _HELPERS and args:
        half[NAME] = _callee_helper_name(args[0], args[1])
    _running[me] = key
    if _replies:  # one whose result never reached the pickler
        _replies.pop(me, None)
    _ring.add(half)
    return half


def finished(half: list, trace: tuple, error: BaseException | None) -> None:
    half[ENDED] = clocks.now()
    me = _get_ident()
    if half[OUTER] is None:
        _running.pop(me, None)
    else:
        _running[me] = half[OUTER]
    if error is not None:
        half[ERROR] = _error_text(error)
    elif trace[1]:  # its result is pickled next, on this thread, as the reply
        _replies[me] = half


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


def count(obj, pickled: int) -> None:
    """The RPC pickler wrote ``obj`` in ``pickled`` bytes on this thread."""
    me = _get_ident()
    half = _sending.pop(me, None) if _sending else None
    if half is not None:
        half[REQUEST_PICKLE] = pickled
        tensors = getattr(torch_compat.tensor_tables, "send_tables", None)
        if tensors:
            half[REQUEST_TENSOR] = _size(tensors)
            # As torch does: a message joins the autograd context only with a tensor that
            # requires grad (and finding the context costs an exception when there is none).
            if half[CONTEXT] is None and any(t.requires_grad for t in tensors):
                half[CONTEXT] = _context()
        return
    half = _replies.pop(me, None) if _replies else None
    if half is not None:
        tensors = getattr(torch_compat.tensor_tables, "send_tables", None)
        half[REPLY_TENSOR], half[REPLY_PICKLE] = _size(tensors), pickled


def received(pickled: int) -> None:
    """The RPC unpickler read ``pickled`` bytes on this thread (while ``fetches``)."""
    half = fetches.pop(_get_ident(), None)
    if half is not None:
        tensors = getattr(torch_compat.tensor_tables, "recv_tables", None)
        half[REPLY_TENSOR], half[REPLY_PICKLE] = _size(tensors), pickled


def _size(tensors) -> int:
    """Bytes of ``tensors`` (a list, or None: torch made no tensor table)."""
    return sum(t.element_size() * t.nelement() for t in tensors) if tensors else 0


# -- distributed autograd ------------------------------------------------------------

_hooked: collections.OrderedDict[int, set] = collections.OrderedDict()
_passes: dict[tuple, int] = {}  # (context, message id, side) -> how many times it fired
_open: dict[tuple, dict] = {}  # callee halves between their pre- and post-hook


def before_backward(context_id: int) -> None:
    """Hook every member's send and recv functions of the context (before a backward)."""
    if not recording:
        return
    from . import calls

    with quiet():
        calls.ask_members(hook_context, (context_id,))


def hook_context(context_id: int) -> int:
    """Hook this member's send/recv functions of a context; returns how many are new."""
    try:
        ctx = torch_compat.retrieve_context(context_id)
    except RuntimeError:
        return 0
    hooked = _hooked.setdefault(context_id, set())
    while len(_hooked) > CONTEXTS_KEPT:
        old, _ = _hooked.popitem(last=False)
        for key in [k for k in _passes if k[0] == old]:
            del _passes[key]
    new = 0
    for message_id, fn in torch_compat.recv_functions(ctx).items():
        if ("recv", message_id) not in hooked:
            hooked.add(("recv", message_id))
            fn.register_prehook(functools.partial(_gradients_sent, context_id, message_id))
            new += 1
    for message_id, fn in torch_compat.send_functions(ctx).items():
        if ("send", message_id) not in hooked:
            hooked.add(("send", message_id))
            fn.register_prehook(functools.partial(_gradients_arrived, context_id, message_id))
            fn.register_hook(functools.partial(_gradients_passed, context_id, message_id))
            new += 1
    return new


def _pass(context_id: int, message_id: int, side: str) -> str:
    key = (context_id, message_id, side)
    _passes[key] = n = _passes.get(key, 0) + 1
    return f"ag:{context_id}:{message_id}:{n}"


def _gradients_sent(context_id: int, message_id: int, grads) -> None:
    """RecvRpcBackward is about to send gradients back to the member that sent its
    tensor forward (worker id: the message id's top 16 bits)."""
    t = clocks.now()
    nbytes = sum(g.element_size() * g.nelement() for g in grads if g is not None)
    _ring.add([_pass(context_id, message_id, "recv"), t, "caller", None, None, None, GRADIENTS,
               message_id >> 48, "autograd", None, None, nbytes, 0, context_id, None, next(_ids)])


def _gradients_arrived(context_id: int, message_id: int, grads) -> None:
    me = _get_ident()
    if me not in _threads:
        _threads[me] = _thread()
    half = [_pass(context_id, message_id, "send"), clocks.now(), "callee", None, None, None, None,
            me, None, None]
    _open[(context_id, message_id)] = half
    _ring.add(half)


def _gradients_passed(context_id: int, message_id: int, grad_inputs, grad_outputs) -> None:
    half = _open.pop((context_id, message_id), None)
    if half is not None:
        half[ENDED] = clocks.now()


# -- gathering -----------------------------------------------------------------------


def report(since: float | None = None, offsets: dict | None = None) -> dict:
    """This member's halves from ``since`` (driver's clock) on, in their final form
    (``records.merge`` reads them)."""
    info = torch_compat.current_agent().get_worker_info()
    offset = (offsets or {}).get(info.name, 0.0)
    local_since = None if since is None else since - offset - 1.0
    call_id = _CallIds()
    halves = [_final(h, call_id) for h in _ring.since(local_since)]
    return dict(name=info.name, id=info.id, host=socket.gethostname(), pid=os.getpid(),
                clock=clocks.clock_id(), recording=recording, halves=halves,
                evicted=[(t, n) for t, n in list(_ring.evicted) if local_since is None or t >= local_since])


def _final(half: list, call_id: _CallIds) -> dict:
    """A half as kept (a list of numbers, idents, the destination as given) as the dict
    ``records.merge`` reads."""
    final = {"side": half[SIDE], "key": call_id(half[KEY]), "t": half[T], "error": half[ERROR],
             "reply": None if half[REPLY_PICKLE] is None else [half[REPLY_TENSOR], half[REPLY_PICKLE]]}
    if half[SIDE] == "caller":
        final.update(
            caller=_me, callee=_name(half[TO]), kind=half[KIND], name=half[NAME], sent=half[T],
            replied=half[REPLIED], request=[half[REQUEST_TENSOR], half[REQUEST_PICKLE]],
            parent=call_id(half[PARENT]), context=half[CONTEXT], rref=half[RREF])
        if half[ID] is not None:  # the gradients' halves: keyed by autograd message
            final["id"] = call_id(half[ID])
    else:
        final.update(member=_me, began=half[T], ended=half[ENDED],
                     thread=_threads.get(half[THREAD], str(half[THREAD])))
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
            self.names[rank] = _name(rank)
        return f"{self.names[rank]}:{key & _COUNT_MASK}"


def gather(start: float | None, clocks_found: dict, timeout: float = 10.0) -> list[dict]:
    from . import calls

    offsets = {name: offset for name, (offset, _) in clocks_found.items()}
    with quiet():
        return calls.ask_members(report, (start, offsets), timeout)


def measure_clocks(timeout: float = 5.0) -> dict[str, tuple[float, float]]:
    """Each member's ``(offset, bound)`` from the driver's clock."""
    from . import calls

    with quiet():
        found = calls.ask_members(identity, (), timeout)
        return clocks.estimate_all({m["name"]: m["clock"] for m in found}, timeout)


def snapshot(start: float, end: float, clocks_found: dict | None = None,
             timeout: float = 10.0) -> TraceSnapshot:
    """Every member's calls sent in [start, end] (driver's clock), joined."""
    if clocks_found is None:
        clocks_found = measure_clocks(timeout)
    reports = gather(start, clocks_found, timeout)
    missing = {r["name"] for r in reports} - set(clocks_found)
    if missing:  # joined since the clocks were measured
        with quiet():
            clocks_found = {**clocks_found, **clocks.estimate_all(
                {r["name"]: r["clock"] for r in reports if r["name"] in missing}, timeout)}
    return records.merge(reports, clocks_found, start, end)


# -- the user's API ---------------------------------------------------------------------


class Trace:
    """``with nbrpc.trace() as t:`` records every RPC of the block on every member.

    After the block (or during it), ``t.snapshot()`` is a ``TraceSnapshot``,
    ``t.summary()`` a table per function and callee, ``t.save("trace.json")`` a Chrome
    trace (Perfetto, chrome://tracing) and ``t.save("report.html")`` a report page.
    """

    def __init__(self, timeout: float = 10.0):
        self.timeout = timeout
        self.start: float | None = None
        self.end: float | None = None
        self._clocks: dict | None = None
        self._snapshot: TraceSnapshot | None = None

    def __enter__(self) -> Trace:
        from . import calls

        with quiet():
            found = calls.ask_members(enable, (True,), self.timeout)
            self._members = {m["name"] for m in found}
            self._clocks = clocks.estimate_all({m["name"]: m["clock"] for m in found}, self.timeout)
        self.start = clocks.now()
        return self

    def __exit__(self, *exc) -> None:
        from . import calls

        self.end = clocks.now()
        _settle(self.start)
        try:
            self._snapshot = snapshot(self.start, self.end, self._clocks, self.timeout)
        finally:
            with quiet():
                calls.ask_members(enable, (False,), self.timeout)

    def snapshot(self) -> TraceSnapshot:
        """The block's calls (so far, while it runs)."""
        if self.start is None:
            raise RuntimeError("this trace has not started: use it as `with nbrpc.trace() as t:`")
        if self._snapshot is not None:
            return self._snapshot
        return snapshot(self.start, clocks.now(), self._clocks, self.timeout)

    def summary(self) -> list[dict]:
        """Per function and callee: count, total and median seconds, bytes each way."""
        return records.summarize(self.snapshot())

    def save(self, path) -> Path:
        """Write the trace: ``.json`` in Chrome's trace event format, ``.html`` a report."""
        path = Path(path)
        if path.suffix == ".json":
            path.write_text(json.dumps(records.chrome_trace(self.snapshot())))
            return path
        if path.suffix in (".html", ".htm"):
            try:
                from .widgets.report import write_report
            except ImportError as e:
                raise RuntimeError(
                    f"cannot write {path.name}: this nbrpc has no HTML report writer "
                    "(nbrpc.widgets.report.write_report); save a .json trace instead and open it "
                    "in https://ui.perfetto.dev or chrome://tracing") from e
            write_report(self.snapshot(), path)
            return path
        raise ValueError(f"cannot save a trace as {path.name!r}: give a path ending in .json "
                         "(Chrome trace event format) or .html (report)")


def _settle(start: float, limit: float = SETTLE) -> None:
    """Wait a little for the replies still on their way to this member's calls since
    ``start``. The owner sends a ``to_here`` its value before it acknowledges the
    ``remote`` that made it, so a block ending in ``to_here`` could otherwise end before
    its ``remote`` was answered (and show it still in flight)."""
    waiting = [h for h in _ring.since(start) if h[SIDE] == "caller" and h[KIND] != "autograd"
               and h[REPLIED] is None and h[ERROR] is None]
    deadline = time.monotonic() + limit
    while waiting and time.monotonic() < deadline:
        time.sleep(0.001)
        waiting = [h for h in waiting if h[REPLIED] is None]


def trace(timeout: float = 10.0) -> Trace:
    """Record every RPC made in a ``with`` block, on every member of the running cluster."""
    return Trace(timeout)


def trace_snapshot(last: float | None = None, timeout: float = 10.0) -> TraceSnapshot:
    """The calls of the last ``last`` seconds (default: all kept) of a cluster started
    with ``trace=True``."""
    from . import cluster as cluster_mod
    from .errors import NoClusterError

    running = cluster_mod.current()
    if running is None:
        raise NoClusterError("no cluster is running; start one with trace=True "
                             "(nbrpc.start(trace=True) or %rpc_init --trace)")
    if not getattr(running, "trace", False):
        raise RuntimeError(
            "this cluster is not recording its calls (it was started without trace=True): "
            "record a block with `with nbrpc.trace() as t:` and read t.snapshot(), or start "
            "the cluster with nbrpc.start(trace=True) / %rpc_init --trace")
    end = clocks.now()
    snap = snapshot(end - last if last is not None else float("-inf"), end, None, timeout)
    if last is None:  # from the first call kept
        snap["start"] = min((c["sent"] for c in snap["calls"]), default=end)
    return snap


_HELPERS = torch_compat.RREF_HELPERS
# Functions that live as long as their process: described once, by themselves.
_LASTING = (type, types.BuiltinFunctionType, torch.jit.ScriptFunction)
