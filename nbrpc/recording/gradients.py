"""A backward pass's gradients, recorded as calls.

Gradients travel in C++ messages no Python sees; hooks on the ``RecvRpcBackward`` (the
sender, in the backward direction) and ``SendRpcBackward`` (the receiver) functions of
a context, paired by autograd message id, stand for them in this member's ring. The
calls layer's ``dist_autograd.backward`` asks every member to ``hook_context`` before
a recorded backward.
"""

from __future__ import annotations

import collections
import functools
import os

from .._compat import torch_compat
from . import clocks, recorder
from .recorder import ENDED, GRADIENTS

CONTEXTS_KEPT = 64  # autograd contexts whose hooks are remembered per member



class Passes:
    """This member's hooked contexts and the gradients' passes through them: one per process,
    forgotten in a forked child (its parent's contexts are not its own)."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.hooked: collections.OrderedDict[int, set] = collections.OrderedDict()
        self.count: dict[tuple, int] = {}  # (context, message id, side) -> how many times it fired
        self.open: dict[tuple, list] = {}  # callee halves between their pre- and post-hook

    def hooked_in(self, context_id: int) -> set:
        """The functions of a context hooked so far; the oldest contexts are forgotten."""
        hooked = self.hooked.setdefault(context_id, set())
        while len(self.hooked) > CONTEXTS_KEPT:
            old, _ = self.hooked.popitem(last=False)
            for key in [k for k in self.count if k[0] == old]:
                del self.count[key]
        return hooked

    def key(self, context_id: int, message_id: int, side: str) -> str:
        """The call id of this pass of the gradients through one function."""
        key = (context_id, message_id, side)
        self.count[key] = n = self.count.get(key, 0) + 1
        return f"ag:{context_id}:{message_id}:{n}"


PASSES = Passes()
os.register_at_fork(after_in_child=PASSES.reset)


def hook_context(context_id: int) -> int:
    """Hook this member's send/recv functions of a context; returns how many are new."""
    try:
        ctx = torch_compat.retrieve_context(context_id)
    except RuntimeError:
        return 0
    hooked = PASSES.hooked_in(context_id)
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


def _gradients_sent(context_id: int, message_id: int, grads) -> None:
    """RecvRpcBackward is about to send gradients back to the member that sent its
    tensor forward (worker id: the message id's top 16 bits)."""
    t = clocks.now()
    nbytes = sum(g.element_size() * g.nelement() for g in grads if g is not None)
    recorder.add([PASSES.key(context_id, message_id, "recv"), t, "caller", None, None, None, GRADIENTS,
                  message_id >> 48, "autograd", None, None, nbytes, 0, context_id, None, recorder.new_id()])


def _gradients_arrived(context_id: int, message_id: int, grads) -> None:
    half = [PASSES.key(context_id, message_id, "send"), clocks.now(), "callee", None, None, None, None,
            recorder.this_thread(), None, None]
    PASSES.open[(context_id, message_id)] = half
    recorder.add(half)


def _gradients_passed(context_id: int, message_id: int, grad_inputs, grad_outputs) -> None:
    half = PASSES.open.pop((context_id, message_id), None)
    if half is not None:
        half[ENDED] = clocks.now()
