"""``dist_autograd.backward`` as the recordings see it.

A recorded backward first asks every member to hook its send and recv functions of the
context (``recording.gradients``), so that the gradients' messages show as calls; a
hooks registered in ``AFTER_BACKWARD`` (the autograd recordings) runs once the pass is done.
"""

from __future__ import annotations

from .._compat import torch_compat
from .._util import Hooks
from ..recording import gradients, recorder
from ..recording.pending import PENDING
from .fanout import ask_members

_torch_backward = torch_compat.backward
# ``hook(context_id, roots)`` after every backward in this process (the autograd recordings).
AFTER_BACKWARD = Hooks()


def install() -> None:
    """Put the wrapper in place (idempotent)."""
    torch_compat.patch(torch_compat.BACKWARD, backward)


def backward(context_id: int, roots, retain_graph: bool = False) -> None:
    """``torch.distributed.autograd.backward``, watched by the recordings and in flight
    (its gradients go to every member of the context) while it runs."""
    key = PENDING.calling(f"context {context_id}", "dist_autograd.backward", None, "backward")
    try:
        _backward(context_id, roots, retain_graph)
    finally:
        PENDING.answered(key)


def _backward(context_id: int, roots, retain_graph: bool) -> None:
    if recorder.RECORDER.recording:  # the hooks that stand for the gradients' messages
        with recorder.quiet():
            ask_members(gradients.hook_context, (context_id,))
    if not AFTER_BACKWARD:
        _torch_backward(context_id, roots, retain_graph=retain_graph)
        return
    roots = list(roots)
    _torch_backward(context_id, roots, retain_graph=retain_graph)
    for hook in AFTER_BACKWARD:
        hook(context_id, roots)
