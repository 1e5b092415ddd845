"""A worker kernel's answer to the driver's probes, on its control channel.

ipykernel serves the control channel on a thread of its own, so the answer comes while
every RPC thread and the kernel's main thread are blocked. The answer is the member's
``diagnostics.waits.member_report`` (its pending calls and every thread's stack).
"""

from __future__ import annotations

from ..cluster.control import REPLY, REQUEST
from ..diagnostics import stacks as stacks_mod
from ..diagnostics import waits as waits_mod


def serve(kernel, name: str) -> None:
    """Answer probes on ``kernel``'s control channel, as member ``name``."""

    def handle(stream, ident, parent) -> None:
        cells = stacks_mod.Cells(getattr(getattr(kernel.shell, "compile", None), "_filename_map", {}),
                                 prefix=f"{name} ")
        try:
            content = {"report": waits_mod.member_report(name, cells)}
        except Exception as e:  # a probe must answer, even to say it failed
            content = {"error": f"{type(e).__name__}: {e}"}
        kernel.session.send(stream, REPLY, content, parent, ident)

    kernel.control_handlers[REQUEST] = handle
