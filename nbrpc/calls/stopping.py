"""What becomes of a call its caller stops waiting for, and the words for it.

- ``stopped``: the error for an interrupted call (the stop button), once its worker
  answered the request to stop it (``interrupts.stop``).
- ``stop_on_timeout``: after torch gave up on a call, stop it on its worker too; the
  caller's error does not wait for the stop to end (torch raises at the timeout).
- ``wait_served``: a served call's wait on one of its own calls, which a stop of the
  served call ends at once.
- ``outcome_text``: the worker's answer in words; a message claims a stop only when
  the worker said the function ended.
"""

from __future__ import annotations

from collections.abc import Callable

from ..recording.functions import destination_name
from . import interrupts

# A stop was asked, and its answer did not come.
NO_ANSWER = "no answer"
# A stop was asked and not waited for (a nested call's: its caller's stop waits for it).
ASKED = "asked"


def stopped(to, label: str, call_id: str | None, why: str = "") -> KeyboardInterrupt:
    """The error for an interrupted call, after asking its worker to stop it: it says
    what the worker answered, never more; ``why`` ends it (the diagnosis)."""
    if call_id is None:
        return KeyboardInterrupt(f"{label} was interrupted; only the waiting stopped{why}")
    stopping = interrupts.send_stop(to, call_id)
    name = destination_name(to)
    if interrupts.served_here() is not None:
        # A nested call, stopped with the call that made it: whoever stopped that one
        # waits for this stop's answer; waiting here too could hold a lock it needs.
        return KeyboardInterrupt(f"{label} was interrupted; {name!r} was asked to stop it{why}")
    outcome = interrupts.stop_outcome(stopping) or NO_ANSWER
    if outcome == interrupts.STOPPED:
        return KeyboardInterrupt(f"{label} was interrupted, and stopped on {name!r} too{why}")
    return KeyboardInterrupt(f"{label} was interrupted; {outcome_text(outcome, name)}{why}")


def outcome_text(outcome: str | None, name: str) -> str:
    """What became of a call ``name`` was asked to stop, in words (None: no stop was
    asked, or its answer is not known here)."""
    if outcome is None:
        return "it may still be running there"
    if outcome == ASKED:
        return f"nbrpc asked {name!r} to stop it"
    if outcome == interrupts.STOPPED:
        return f"nbrpc stopped it on {name!r}"
    if outcome == interrupts.UNSET:
        return (f"the future its @async_execution function returned on {name!r} was still "
                "not set; nbrpc stopped waiting on it")
    if outcome == interrupts.NOT_RUNNING:
        return f"it was not running on {name!r} when nbrpc went to stop it (it had ended, or will not begin)"
    if outcome == interrupts.LEFT_TO_RUN:
        return (f"it was not running on {name!r} when nbrpc went to stop it (it had ended, or it runs "
                "when it begins, as torch runs a call whose caller gave up on it)")
    if outcome.startswith(interrupts.ENDED):
        return f"it had ended on {name!r} when nbrpc went to stop it, with {outcome[len(interrupts.ENDED):]}"
    if outcome == interrupts.STILL_RUNNING:
        return (f"{name!r} was asked to stop it but it still runs there: a long C call (one "
                "big time.sleep, a lock's acquire without a timeout) stops only when it returns")
    return f"{name!r} did not answer the request to stop it, so it may still be running there"


def timed_out(error: Exception) -> bool:
    return isinstance(error, RuntimeError) and "RPC ran for more than set timeout" in str(error)


def stop_on_timeout(error: Exception, to, call_id: str | None) -> str | None:
    """After torch gave up on call ``call_id`` (its timeout), stop it on ``to``; what
    became of it (see ``interrupts.stop``) if the answer comes within
    ``interrupts.TIMEOUT_ANSWER`` s, else ``ASKED`` (the stop goes on); or None."""
    if call_id is None or not timed_out(error):
        return None
    stopping = interrupts.send_stop(to, call_id, interrupts.TIMEOUT_STOP_GRACE, cancel=False)
    if interrupts.served_here() is not None:
        return ASKED  # a nested call: see stopped
    return outcome(stopping)


def stop_if_timed_out(error: Exception, to, call_id: str | None):
    """After torch gave up on call ``call_id`` (an ``rpc_async``'s), stop it on ``to``
    without waiting: the stop's Future (``outcome`` reads it), or None."""
    if call_id is None or not timed_out(error):
        return None
    return interrupts.send_stop(to, call_id, interrupts.TIMEOUT_STOP_GRACE, cancel=False)


def outcome(stop) -> str | None:
    """The answer to a stop ``send_stop`` sent after a timeout, if it comes within
    ``interrupts.TIMEOUT_ANSWER`` s (a timeout's error is not held up for it: ``ASKED``
    when it has not come); None if no stop was sent."""
    if stop is None:
        return None
    if not interrupts.answered(stop, interrupts.TIMEOUT_ANSWER):
        return ASKED
    return interrupts.stop_outcome(stop, 0) or NO_ANSWER


def wait_served(served: interrupts.Served | None, done, wait: Callable[[], None]) -> None:
    """``wait()`` until ``done`` (a held lock) is released, by the answer or by a stop of
    ``served`` if any (then ``KeyboardInterrupt``)."""
    if served is None:
        wait()
        return
    if not interrupts.waiting(served, done):
        raise KeyboardInterrupt
    try:
        wait()
    finally:
        stopped = not interrupts.waiting(served, None)
    if stopped:
        raise KeyboardInterrupt
