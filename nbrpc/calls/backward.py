"""``dist_autograd.backward`` as the recordings see it.

A recorded backward first asks every member to hook its send and recv functions of the
context (``recording.gradients``), so that the gradients' messages show as calls; a
hooks registered in ``AFTER_BACKWARD`` (the autograd recordings) runs once the pass is done.
While it runs, a backward is a call in flight to each member its context reached.
"""

from __future__ import annotations

import torch.distributed.rpc as rpc

from .._compat import torch_compat
from .._util import Hooks
from ..errors import RpcTimeoutError
from ..recording import gradients, recorder
from ..recording.pending import PENDING
from . import stopping
from .fanout import ask_members

_torch_backward = torch_compat.backward
# What a backward's calls in flight are named: the gradients it sends each member.
GRADIENTS = "dist_autograd.backward"
# ``hook(context_id, roots)`` after every backward in this process (the autograd recordings).
AFTER_BACKWARD = Hooks()


def install() -> None:
    """Put the wrapper in place (idempotent)."""
    torch_compat.patch(torch_compat.BACKWARD, backward)


def backward(context_id: int, roots, retain_graph: bool = False) -> None:
    """``torch.distributed.autograd.backward``, watched by the recordings and in flight
    (its gradients go to every member of the context) while it runs."""
    keys = [PENDING.calling(member, GRADIENTS, None, "backward") for member in _reached(context_id)]
    try:
        _backward(context_id, roots, retain_graph)
    except RuntimeError as e:
        if not stopping.timed_out(e):
            raise
        why = next((text for text in map(PENDING.explained, keys) if text), "")
        torch_said = str(e).split("\n\nAt:", 1)[0].strip()
        raise RpcTimeoutError(f"dist_autograd.backward({context_id}) got no answer within "
                              f"{rpc.get_rpc_timeout():g} s for its gradients{why}. "
                              f"Torch said: {torch_said}") from e
    finally:
        for key in keys:
            PENDING.answered(key)


def _reached(context_id: int) -> list[str]:
    """The members the context's gradients go to (the workers its forward reached),
    each a call in flight while the backward runs: a member whose RPC threads are all
    busy holds the gradient message, and so the backward."""
    try:
        agent = torch_compat.current_agent()
        ids = torch_compat.known_worker_ids(torch_compat.retrieve_context(context_id))
        return sorted(agent.get_worker_info(i).name for i in ids) or [f"context {context_id}"]
    except Exception:  # torch's own backward says what is wrong with the context
        return [f"context {context_id}"]


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
