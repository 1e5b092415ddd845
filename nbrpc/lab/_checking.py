"""What the checkers of every lab share.

Parts:

- ``_Checks``: one lab's checkers by exercise name, each registered with
  ``@CHECKS.exercise("lab.name")``.
- ``_Wrong`` and ``_NotDone``: what a checker raises to report a mistake or an unfinished
  exercise; ``check`` turns them into ✗ lines, raised as ``CheckFailed``.
- ``_call`` calls the student's code and turns its errors into those, with a hint for
  known mistakes (``_HINTS``).
- ``_describe``, ``_show``, ``_close`` and ``_loss_is``: errors and values in a line,
  and comparisons with the expected values.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable

import torch

from ..errors import NOT_INITIALIZED, not_initialized

FILL_IN = "fill in the TODO cell above, run it, then run this check again"


class _Checks(dict[str, Callable[..., str]]):
    """One lab's checkers by exercise name, in the order they are registered."""

    def exercise(self, name: str):
        """Decorator: register the checker of exercise ``name``."""
        def register(checker):
            self[name] = checker
            return checker
        return register


class CheckFailed(AssertionError):
    """An exercise's check failed; the message is its ✗ line and hint.

    An ``AssertionError``, as the failure of any test cell, so nbgrader scores the cell 0.
    A notebook shows the message alone: the checker's frames would only hide it.
    """

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


class _Wrong(Exception):
    """A checker found a mistake: ``message`` says what, ``hint`` how to fix it."""

    status = "wrong"

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


class _NotDone(_Wrong):
    status = "not done"


# Known errors (regular expressions) -> what usually causes them; the first match wins.
_HINTS = [
    ("(?i)" + NOT_INITIALIZED.pattern, "run the %rpc_init cell near the top of the lab first, then this check"),
    (r"unsupported operand type\(s\) for [-+]: .*'NoneType'",
     "a call whose callee's part was not recorded has began and ended None: skip it"),
    (r"can't call localValue\(\) on user",
     "local_value() works only on the RRef's owner: send a function to rref.owner() with "
     "rpc.rpc_sync and call local_value() there"),
    ("Could not find autograd context",
     "the dist_autograd context had already ended: call dist_autograd.backward, "
     "get_gradients and optimizer.step inside the `with dist_autograd.context() as "
     "context_id:` block"),
    ("graphTask_ INTERNAL ASSERT FAILED",
     "loss.backward() does not follow RPCs; use dist_autograd.backward(context_id, [loss])"),
    (r"missing 1 required positional argument: 'context_id'",
     "DistributedOptimizer.step takes the context id: optimizer.step(context_id)"),
    ("does not require grad",
     "the loss must come from the model's output (computed through RPC), not from a copy "
     "detached from it"),
    (r"KeyError\W*(tensor|Parameter)",
     "get_gradients(context_id) on a process holds only the gradients of that process's "
     "tensors: read it on the tensor's owner"),
]


def _call(fn, *args, what: str, returns: bool = True, none_hint: str = FILL_IN,
          hints: list[tuple[str, str]] = (), **kwargs):
    """``fn(*args, **kwargs)``; an error becomes ``_NotDone`` or ``_Wrong`` naming ``what``.

    A function that should return something and returns None is not done yet either.
    ``hints`` are a lab's own (pattern, hint) pairs, tried before the shared ``_HINTS``.
    """
    if not callable(fn):
        raise _NotDone(f"{what.split('(')[0]} is {_show(fn)}, not a function yet", FILL_IN)
    try:
        value = fn(*args, **kwargs)
    except Exception as e:
        unfinished = _unfinished(e)
        if unfinished is not None:
            name = what.split("(")[0]
            if unfinished in ("", name):
                raise _NotDone(f"{name} still raises NotImplementedError", FILL_IN) from None
            raise _NotDone(f"{what} reached {unfinished}, which still raises NotImplementedError",
                           f"fill in {unfinished} (in this TODO cell or an earlier one), "
                           "run its cell and the cells after it, then this check") from None
        text = f"{type(e).__name__}: {e}"
        hint = next((h for needle, h in [*hints, *_HINTS] if re.search(needle, text)),
                    "read the error, fix the TODO cell, run it, then this check again")
        raise _Wrong(f"{what} raised {_describe(e)}", hint) from None
    if returns and value is None:
        raise _NotDone(f"{what.split('(')[0]} returned None", none_hint)
    return value


def _unfinished(error: Exception) -> str | None:
    """The function still raising ``NotImplementedError`` in ``error``, here or on a worker.

    A skeleton's ``NotImplementedError("name")`` names it; nbgrader's stub,
    ``NotImplementedError()``, is named by the innermost frame of the traceback.
    """
    text = str(error)
    found = re.search(r"NotImplementedError\((['\"])(\w*)\1\)", text)
    if found:
        return found.group(2)
    if re.search(r"On WorkerInfo\(id=\d+, name=[^)]+\):\nNotImplementedError\(\)", text):
        frames = re.findall(r", in (\w+)\n", text.split("\nAt:\n")[0])
        return frames[-1] if frames else ""
    if isinstance(error, NotImplementedError) and "On WorkerInfo" not in text:
        if text.isidentifier():
            return text
        frames = traceback.extract_tb(error.__traceback__)
        return frames[-1].name if frames else ""
    return None


def _describe(error: Exception) -> str:
    """One line about ``error``; a worker's error is named with the worker."""
    if not_initialized(error):  # torch's advice (call init_rpc) is wrong in a notebook
        return "RuntimeError: RPC is not running yet (no %rpc_init in this kernel)"
    text = re.sub(r"For UserRRef\(rref_id=.*?\)\), ", "", str(error))  # ids nobody needs
    text = re.sub(r' at "[^"]*":\d+, please report a bug to PyTorch\.', "", text)
    remote = re.search(r"On WorkerInfo\(id=\d+, name=([^)]+)\):\n(.+)", text)
    if remote:
        return f"{remote.group(2).strip()[:200]} on {remote.group(1)}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first[:200]}" if first else type(error).__name__


def _show(value) -> str:
    if isinstance(value, torch.Tensor):
        return str([round(v, 4) for v in value.detach().flatten().tolist()][:8])
    if isinstance(value, torch.futures.Future):
        return "a Future (call .wait() on it for the value)"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _close(got, expected, atol: float = 1e-4) -> bool:
    return (isinstance(got, torch.Tensor) and got.shape == expected.shape
            and torch.allclose(got.detach().float(), expected.float(), atol=atol))


def _loss_is(loss, expected: float) -> bool:
    """Whether a returned loss (a float, or a one-element tensor) is ``expected``."""
    return isinstance(loss, (float, torch.Tensor)) and abs(float(loss) - expected) <= 1e-4
