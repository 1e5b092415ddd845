"""Lab 9's checks: three staged hangs, the finding nbrpc names for each, and its fix.

Parts:

- The kind checks (``lock_kind``, ``pool_kind``, ``caller_kind``): the kind the student
  read in ``nbrpc.waits()`` while the lab's staged hang held, against the one nbrpc names
  for it; a wrong kind is told what the wait-for graph shows.
- The fix checks (``outer_fixed``, ``wait_for_update_fixed``, ``rescale_fixed``): the
  student's functions run on the cluster under short timeouts while ``_Watch`` notes the
  findings nbrpc names, so that a fix that still hangs is told what still holds, in a
  line. Each check waits until the calls it made have ended (or gave up) before it
  answers, and turns worker1's torch-only serving back off, so the cluster is usable after.
- A bug on a worker, found with pdb (``worker2_region``, ``discounted_total_fixed``):
  ``region_here`` is each worker's region as its configuration says, worker2's with a
  stray space; the student reads it at a ``breakpoint()`` on worker2, then fixes the
  function that looked its discount up with it.
"""

from __future__ import annotations

import inspect
import re
import threading
import time

import torch
import torch.distributed.rpc as rpc

from ..cluster import cluster as cluster_mod
from ..cluster import queries
from ._checking import FILL_IN, _call, _Checks, _describe, _NotDone, _show, _unfinished, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

KINDS = ("blocked", "cycle", "pool_exhausted", "waits_on_caller", "unset_future", "dead_member")
# Seconds a fix may take in a check (a right one takes a fraction of a second).
LIMIT = 3.0

_READ = ("print the findings of the snapshot taken while it hung ({case}: show({case})) and "
         "return the kind each line starts with, as a string")
_SHOWS = {
    "lock": "the graph is master -> worker1 (outer) -> worker1 (inner), and inner is blocked "
            "at `with lock:`, the lock outer holds: a call blocked on a lock",
    "pool": "every RPC thread of worker1 runs wait_for_update, blocked until an update comes, "
            "and push_update, which brings it, is queued behind them: a full pool of threads",
    "caller": "master waits (to_here) on scaled on worker2, whose call back to master is blocked "
              "at `with held:`, the lock master holds while it waits: the chain comes back to "
              "its caller",
}
_RELEASE = ("release the lock before the nested call: do the work that needs it inside "
            "`with lock:`, then call rpc.rpc_sync after the block")
_ASYNC = ("do not wait in wait_for_update_fixed: return a new torch.futures.Future() kept in "
          "waiters (@rpc.functions.async_execution sends the reply when it completes), and "
          "have push_update_fixed call set_result(v) on each")
# Known errors of this lab's answers -> what causes them.
_POOL_HINTS = [
    ("(?i)pickle.*Future|Future.*pickle",
     "a plain function cannot return a Future: put @rpc.functions.async_execution back above "
     "def wait_for_update_fixed"),
]
# Lab 9's bug on a worker: each worker's region as its configuration says (worker2's file
# has a stray space), and the discount of each region.
_REGIONS = {"worker1": "eu", "worker2": "eu "}
DISCOUNTS = {"eu": 0.2, "us": 0.1}
_STEP_IN = ("put breakpoint() after the `rate = ...` line of discounted_total (the locked cell "
            "above has it: discounted_total_stepped), call it on worker2, and at the "
            "(Pdb) [worker2] prompt type `p region`")
_PASS = ("pass the value: set the scale under `with held:`, then, after the block, call worker2 "
         "with the scale as an argument (rpc.remote(\"worker2\", scaled_by, args=(x, scale))), "
         "so that it never calls back into master")


def _waits() -> dict:
    return queries.waits(cluster_mod.current())


class _Watch:
    """Notes every finding ``nbrpc.waits()`` names while a ``with`` block runs."""

    def __init__(self, every: float = 0.3):
        self.every, self.kinds, self._done = every, set(), threading.Event()
        self._thread = threading.Thread(target=self._look, daemon=True, name="lab-watch")

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(5)

    def _look(self) -> None:
        while not self._done.wait(self.every):
            try:
                self.kinds.update(f["kind"] for f in _waits()["findings"])
            except Exception:  # a member going away meanwhile: the next look tells
                pass


def _settle(limit: float) -> bool:
    """Wait until no call is pending in the cluster; whether that came within ``limit`` s."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not _waits()["calls"]:
            return True
        time.sleep(0.2)
    return False


def _timeouts(fn) -> list[float]:
    """The ``timeout=`` numbers in ``fn``'s source (a cell's function has its source)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return []
    return [float(t) for t in re.findall(r"timeout\s*=\s*(\d+(?:\.\d*)?)", source)]


def _outcomes(futures) -> list:
    """Each future's value, or the error it ended with."""
    out = []
    for future in futures:
        try:
            out.append(future.wait())
        except Exception as e:
            out.append(e)
    return out


def _raise_unfinished(outcomes, name: str) -> None:
    for e in outcomes:
        if isinstance(e, Exception) and _unfinished(e) is not None:
            raise _NotDone(f"{name} still raises NotImplementedError", FILL_IN)


def _check_kind(answer, snapshot, case: str, expected: set[str]) -> str:
    name = f"{case}_kind"
    got = _call(answer, what=f"{name}()", none_hint=_READ.format(case=f"{case}_case"))
    if not isinstance(got, str):
        raise _Wrong(f"{name}() returned {_show(got)}; expected the finding's kind as a string",
                     _READ.format(case=f"{case}_case"))
    if got not in KINDS:
        raise _Wrong(f"{got!r} is not a kind nbrpc names; its kinds are {', '.join(KINDS)}",
                     _READ.format(case=f"{case}_case"))
    named = sorted({f["kind"] for f in (snapshot or {}).get("findings", [])} & expected)
    said = f"; nbrpc named {' and '.join(named)}" if named else ""
    if got not in expected:
        raise _Wrong(f"{name}() says {got!r}, but {_SHOWS[case]}{said}",
                     _READ.format(case=f"{case}_case"))
    return f"{got}: {_SHOWS[case]}"


def _wrong_values(outcomes, expected, what: str, hints=()) -> None:
    for got, want in zip(outcomes, expected):
        if isinstance(got, Exception):
            text = f"{type(got).__name__}: {got}"
            hint = next((h for needle, h in hints if re.search(needle, text)),
                        "read the error, fix the TODO cell, run it, then this check again")
            raise _Wrong(f"{what} raised {_describe(got)}", hint)
        if got != want:
            raise _Wrong(f"{what} returned {_show(got)}; expected {_show(want)}",
                         "return what the nested call returns")


@CHECKS.exercise("hangs.lock_kind")
def _check_lock_kind(lock_kind, lock_case) -> str:
    return _check_kind(lock_kind, lock_case, "lock", {"blocked"})


@CHECKS.exercise("hangs.outer_fixed")
def _check_outer_fixed(outer_fixed) -> str:
    if not callable(outer_fixed):
        raise _NotDone(f"outer_fixed is {_show(outer_fixed)}, not a function yet", FILL_IN)
    xs = [3, 4, 5, 6]
    with _Watch() as watch:
        futures = [rpc.rpc_async("worker1", outer_fixed, args=(x,), timeout=LIMIT) for x in xs]
        outcomes = _outcomes(futures)
    _raise_unfinished(outcomes, "outer_fixed")
    if any(isinstance(o, Exception) for o in outcomes) and "blocked" in watch.kinds:
        longer = "" if all(0 < t <= 4 for t in _timeouts(outer_fixed)) else (
            " (a longer timeout only makes the hang longer)")
        raise _Wrong("outer_fixed still hangs (nbrpc: blocked): the lock is still held while it "
                     f"calls inner on worker1, which needs that lock{longer}", _RELEASE)
    if any(isinstance(o, TimeoutError) for o in outcomes):
        raise _Wrong(f"outer_fixed still hangs: calls to it got no answer within {LIMIT:.0f} s",
                     _RELEASE)
    _wrong_values(outcomes, [2 * x + 1 for x in xs], "outer_fixed(x) on worker1")
    return "4 calls at once on worker1 each took the lock, let it go, then called inner: 2x + 1"


def _answered_early(waiting) -> None:
    """Fail if a call to wait_for_update_fixed came back before any update was pushed."""
    early = [f for f in waiting if f.done()]
    if not early:
        return
    outcomes = _outcomes(early)
    _raise_unfinished(outcomes, "wait_for_update_fixed")
    if isinstance(outcomes[0], Exception):
        _wrong_values(outcomes[:1], [None], "wait_for_update_fixed() on worker1", hints=_POOL_HINTS)
    raise _Wrong(f"wait_for_update_fixed() answered {_show(outcomes[0])} before any update "
                 "was pushed: it must wait for the next push_update_fixed",
                 "return a new torch.futures.Future() kept in waiters; push_update_fixed "
                 "completes it")


def _push_until_answered(push_update_fixed, waiting, version: int) -> list:
    """Push ``version`` (again once a push is done, while calls still wait) for ``LIMIT`` s."""
    end, pushes = time.monotonic() + LIMIT, []
    while time.monotonic() < end and not all(f.done() for f in waiting):
        if not pushes or pushes[-1].done():
            pushes.append(rpc.rpc_async("worker1", push_update_fixed, args=(version,), timeout=LIMIT))
        time.sleep(0.1)
    return _outcomes(pushes)


@CHECKS.exercise("hangs.pool_kind")
def _check_pool_kind(pool_kind, pool_case) -> str:
    return _check_kind(pool_kind, pool_case, "pool", {"cycle", "pool_exhausted"})


@CHECKS.exercise("hangs.wait_for_update_fixed")
def _check_wait_for_update_fixed(wait_for_update_fixed, push_update_fixed) -> str:
    for name, fn in [("wait_for_update_fixed", wait_for_update_fixed),
                     ("push_update_fixed", push_update_fixed)]:
        if not callable(fn):
            raise _NotDone(f"{name} is {_show(fn)}, not a function yet", FILL_IN)
    cluster = cluster_mod.current()
    cluster.serve_on_torch_threads(True, "worker1")
    try:
        with _Watch() as watch:
            waiting = [rpc.rpc_async("worker1", wait_for_update_fixed, timeout=LIMIT + 1)
                       for _ in range(6)]
            time.sleep(0.5)
            _answered_early(waiting)
            pushed = _push_until_answered(push_update_fixed, waiting, 7)
            outcomes = _outcomes(waiting)
    finally:
        cluster.serve_on_torch_threads(False, "worker1")
        _settle(4.0)
    _raise_unfinished(outcomes + pushed, "wait_for_update_fixed or push_update_fixed")
    stuck = sorted(watch.kinds & {"cycle", "pool_exhausted"})
    if stuck:
        raise _Wrong(f"wait_for_update_fixed still hangs (nbrpc: {' and '.join(stuck)}): "
                     "each call holds one of worker1's 4 RPC threads while it waits, and "
                     "push_update_fixed, which would end the wait, queues behind them", _ASYNC)
    if any(isinstance(o, TimeoutError) for o in outcomes):
        raise _Wrong(f"wait_for_update_fixed still hangs: calls to it got no answer within "
                     f"{LIMIT + 1:.0f} s, though push_update_fixed came", _ASYNC)
    _wrong_values(outcomes, [7] * len(waiting), "wait_for_update_fixed() on worker1",
                  hints=_POOL_HINTS)
    return ("6 calls waited on worker1's 4 torch threads at once, none holding a thread; one "
            "push_update_fixed(7) answered them all")


@CHECKS.exercise("hangs.caller_kind")
def _check_caller_kind(caller_kind, caller_case) -> str:
    return _check_kind(caller_kind, caller_case, "caller", {"waits_on_caller"})


@CHECKS.exercise("hangs.rescale_fixed")
def _check_rescale_fixed(rescale_fixed) -> str:
    x, scale = torch.tensor([1.0, 2.0]), 5.0
    with _Watch() as watch:
        try:
            got = _call(rescale_fixed, x, scale, what="rescale_fixed(x, 5.0)",
                        hints=[("got no answer within", _PASS)])
        except _Wrong as wrong:
            if wrong.status == "wrong" and "waits_on_caller" in watch.kinds:
                _settle(4.0)
                raise _Wrong("rescale_fixed still hangs (nbrpc: waits_on_caller): master waits "
                             "on worker2 while it holds `held`, and worker2 calls back "
                             "read_scale on master, which needs it", _PASS) from None
            raise
    _settle(4.0)
    if isinstance(got, rpc.PyRRef):
        raise _Wrong("rescale_fixed returned an RRef; expected its value, a tensor",
                     "return rref.to_here() (outside the lock)")
    if not (isinstance(got, torch.Tensor) and torch.allclose(got, x * scale)):
        raise _Wrong(f"rescale_fixed(x, 5.0) returned {_show(got)}; expected x * 5.0 = "
                     f"{_show(x * scale)}", "return worker2's result: x times the new scale")
    return "master set the scale and got x * scale from worker2 without a call back into master"


def region_here() -> str:
    """This worker's region, as its configuration says (lab 9's bug on a worker)."""
    return _REGIONS.get(rpc.get_worker_info().name, "eu")


@CHECKS.exercise("hangs.worker2_region")
def _check_worker2_region(worker2_region) -> str:
    got = _call(worker2_region, what="worker2_region()", none_hint=_STEP_IN)
    actual = _REGIONS["worker2"]
    if got == actual:
        return (f"worker2 read the region {actual!r}: with its stray space it is no key of "
                "DISCOUNTS, so DISCOUNTS.get gave the rate 0.0")
    if isinstance(got, str) and got.strip() == actual.strip():
        raise _Wrong(f"worker2_region() says {got!r}: close, but not exactly what worker2 read",
                     "pdb's `p region` shows the string in quotes, spaces and all: copy it as it is")
    raise _Wrong(f"worker2_region() says {_show(got)}, which is not the region worker2 read", _STEP_IN)


@CHECKS.exercise("hangs.discounted_total_fixed")
def _check_discounted_total_fixed(discounted_total_fixed) -> str:
    for prices in ([50.0, 50.0], [19.99, 5.01, 75.0]):
        expected = round(sum(prices) * (1 - DISCOUNTS["eu"]), 2)
        for worker in ("worker1", "worker2"):
            what = f"discounted_total_fixed({prices}) on {worker}"
            got = _call(rpc.rpc_sync, worker, discounted_total_fixed, args=(prices,), timeout=LIMIT, what=what)
            if got != expected:
                hint = ("clean the region before the lookup: DISCOUNTS.get(region.strip(), 0.0)"
                        if got == round(sum(prices), 2) else "return the total after the discount, "
                        "rounded to cents, as discounted_total does")
                raise _Wrong(f"{what} is {_show(got)}, not {expected}", hint)
    return "both workers give the eu discount (20%): worker2's region is read without its stray space"
