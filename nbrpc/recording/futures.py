"""Where each ``torch.futures.Future`` made in Python was made.

An ``@rpc.functions.async_execution`` function answers when the future it returned
completes; one that nobody completes leaves its caller waiting. ``hook`` puts a
``Future.__init__`` in place that keeps the code and instruction offset of the frame
that made the future (two attribute reads and one store, no line lookup), so that
``made_at`` can say "cell 5, line 2" when such a future stays unset. Futures torch
makes in C++ (``then``, a call's own future) have no such site.
"""

from __future__ import annotations

import sys

import torch

from .._compat import torch_compat

_torch_future_init = torch.futures.Future.__init__
_getframe = sys._getframe


def _future_init(self, *, devices=None):
    frame = _getframe(1)
    self._made_at = (frame.f_code, frame.f_lasti)
    _torch_future_init(self, devices=devices)


def hook() -> None:
    """Keep each new Future's site (idempotent)."""
    torch_compat.patch(torch_compat.FUTURE_INIT, _future_init)


def made_at(fut) -> tuple | None:
    """(code, offset) of the frame that made ``fut``, if it was made in Python."""
    return getattr(fut, "_made_at", None)
