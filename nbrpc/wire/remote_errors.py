"""Remote exceptions keep their class: ``except NotebookError:`` works across RPC.

torch re-creates a remote exception on the caller (``torch_compat.handle_exception``) but
does so inside a C++ callback, which turns any class but a few builtins into a
``RuntimeError`` holding its text. The wrapper below keeps each re-created exception
for a moment; ``original`` finds it again from the ``RuntimeError``'s text, so the
caller's wrappers (``calls``) raise the exception itself, of the caller's own class
(a class defined in a cell comes home as the notebook's class, see ``definitions``).
"""

from __future__ import annotations

import collections
import threading

from .._compat import torch_compat

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
