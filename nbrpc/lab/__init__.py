"""Checks for the teaching labs in ``tutorials/labs``, the nbgrader course's test cells.

Parts:

- ``check(exercise, *answer)`` runs one exercise's checker against the live cluster: it
  prints ✓ with what was verified, or raises ``CheckFailed`` whose message is ✗ with what
  is wrong and a hint (or ✗ "not done yet"). Raising is what makes nbgrader's autograded
  test cell score 0; the error shows as those lines alone, not as a traceback.
- ``summary()`` prints how many exercises of the lab pass; ``results()`` returns them.
- The checkers, one per exercise, in the ``CHECKS`` of each lab's module: ``rpc_basics``,
  ``dist_autograd``, ``param_server`` (with the lab's data, ``digits``), ``pipeline``,
  ``rl``, ``federated``, ``rnn``, ``hybrid`` and ``hangs``. They call the student's code with their own inputs
  and verify values on the workers. What they send to workers lives at module level, so
  workers import it by reference. ``_checking`` holds what they share: calling the
  student's code, and the errors that become ✗ lines.

Generating the student version and grading are nbgrader's (``tutorials/labs`` is its
course directory: ``nbgrader generate_assignment``, ``nbgrader autograde``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

from ..cluster import cluster as cluster_mod
from . import dist_autograd, federated, hangs, hybrid, param_server, pipeline, rl, rnn, rpc_basics
from ._checking import FILL_IN, CheckFailed, _describe, _Wrong
from .hangs import region_here
from .hybrid import ddp_port
from .param_server import digits

__all__ = ["CheckFailed", "Result", "check", "ddp_port", "digits", "region_here", "results", "summary"]

# The workers each lab's %rpc_init cell starts; checks run on exactly these.
LAB_WORKERS = {
    "rpc_basics": ("worker1", "worker2"),
    "dist_autograd": ("worker1", "worker2"),
    "param_server": ("ps", "trainer1", "trainer2"),
    "pipeline": ("worker1", "worker2"),
    "rl": ("observer1", "observer2"),
    "federated": ("client1", "client2", "client3"),
    "rnn": ("ps",),
    "hybrid": ("ps", "trainer0", "trainer1"),
    "hangs": ("worker1", "worker2"),
}
# Every exercise's checker, lab by lab in the order of the notebooks (the order
# check() names them in and summary() lists them in).
_CHECKS: dict[str, Callable[..., str]] = {
    **rpc_basics.CHECKS, **dist_autograd.CHECKS, **param_server.CHECKS,
    **pipeline.CHECKS, **rl.CHECKS, **federated.CHECKS,
    **rnn.CHECKS, **hybrid.CHECKS, **hangs.CHECKS}

# Reachable here too: what the checks send to workers, and the lab's Counter (tests
# subclass it).
cube, sine = dist_autograd.cube, dist_autograd.sine
_Counter = rpc_basics._Counter


@dataclass
class Result:
    """The outcome of one check: ``status`` is "pass", "wrong" or "not done"."""

    exercise: str
    status: str
    message: str
    hint: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def line(self) -> str:
        mark = "✓" if self.passed else "✗"
        unfinished = "not done yet: " if self.status == "not done" else ""
        text = f"{mark} {self.exercise}: {unfinished}{self.message}"
        return text + (f"\n    hint: {self.hint}" if self.hint else "")


_results: dict[str, Result] = {}
_last_lab: list[str] = []


def check(exercise: str, *answer) -> None:
    """Check ``answer`` (the student's functions) for ``exercise``: print ✓, or raise ✗.

    Raises
    ------
    CheckFailed
        The answer is wrong or not done yet; its message is the ✗ line and the hint.
    """
    result = _run_check(exercise, answer)
    if exercise in _CHECKS:
        _results[exercise] = result
        _last_lab[:] = [exercise.split(".")[0]]
    if not result.passed:
        raise CheckFailed(result.line())
    print(result.line(), flush=True)


def summary(lab: str | None = None) -> None:
    """Print how many exercises of ``lab`` (default: the one checked last) pass."""
    lab = lab or (_last_lab[0] if _last_lab else None)
    names = [n for n in _CHECKS if n.split(".")[0] == lab]
    if not names:
        print("no exercise has been checked yet: run the check cells above first", flush=True)
        return
    passed = sum(_results[n].passed for n in names if n in _results)
    lines = [f"{lab}: {passed} of {len(names)} exercises pass"]
    for name in names:
        result = _results.get(name)
        state = {None: "not checked yet (run its check cell)", "pass": "pass",
                 "not done": "not done yet", "wrong": "not right yet (see its check above)"}
        lines.append(f"  {'✓' if result and result.passed else '✗'} {name}: "
                     f"{state[result.status if result else None]}")
    print("\n".join(lines), flush=True)


def results() -> dict[str, Result]:
    """The latest result of every exercise checked in this kernel."""
    return dict(_results)


def _run_check(exercise: str, answer: tuple) -> Result:
    checker = _CHECKS.get(exercise)
    if checker is None:
        known = ", ".join(_CHECKS)
        return Result(exercise, "wrong", f"there is no exercise named {exercise!r}",
                      f"keep the check cell as it was handed out; the exercises are: {known}")
    problem = _cluster_problem(exercise.split(".")[0])
    if problem:
        return Result(exercise, "wrong", problem, "run the %rpc_init cell at the top of this lab "
                      "(after %rpc_shutdown, run it again), then the cells from there on")
    if not answer or any(a is None for a in answer):
        return Result(exercise, "not done", "there is nothing to check yet", FILL_IN)
    try:
        return Result(exercise, "pass", checker(*answer))
    except _Wrong as e:
        _release(e)
        return Result(exercise, e.status, e.message, e.hint)
    except Exception as e:  # a bug in a checker must not stop the lab either
        _release(e)
        return Result(exercise, "wrong", f"the check could not finish: {_describe(e)}",
                      "run the cells above this one in order, then this one again")


def _release(error: BaseException) -> None:
    """Drop the locals of the frames ``error`` went through, now.

    An exception and the frames of its traceback form a cycle that only the garbage
    collector frees; a check's RRefs would then outlive it, maybe the cluster too
    (torch logs an error when an RRef is deleted after its owner is gone).
    """
    while error is not None:
        traceback.clear_frames(error.__traceback__)
        error = error.__context__


def _cluster_problem(lab: str) -> str:
    cluster = cluster_mod.current()
    if cluster is None or cluster.state != "running":
        return "no cluster is running"
    names = {w.name for w in cluster.workers if w.state == "running"}
    missing = [n for n in LAB_WORKERS[lab] if n not in names]
    if missing:
        return (f"this lab needs the workers {', '.join(LAB_WORKERS[lab])}; "
                f"missing: {', '.join(missing)}")
    return ""
