"""torch's C++ future's own hook on what ``wait()`` and ``value()`` give: its ``unwrap``
function, called with the value before they return it (torch's ``set_exception`` raises
there); known to work with torch 2.11 to 2.15."""

from __future__ import annotations

from collections.abc import Callable

import torch


def set_unwrap(fut: torch._C.Future, unwrap: Callable) -> None:
    """``unwrap(value)`` runs in ``fut``'s ``wait()`` and ``value()``; what it raises, they raise."""
    torch._C.Future._set_unwrap_func(fut, unwrap)
