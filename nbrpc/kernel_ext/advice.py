"""What a student sees when a cell uses torch's RPC before ``%rpc_init``.

torch says "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.":
right in a script, wrong in a notebook, where ``%rpc_init`` starts RPC (and the workers).
``RpcAdvice`` is an IPython custom exception handler: that error becomes one line
saying to run ``%rpc_init`` first. An error raised on a worker carries the worker's
traceback as text (torch sends it so); a frame of that text in one of this kernel's
cells reads ``Cell In[N], line L`` there, as IPython names local frames, and nbrpc's
own call wrappers leave the local part (``remote_errors.show_in_cell``, which a worker's
kernel uses too, for its own cells). An error of nbrpc's call wrappers (a timeout, a
worker's death) shows as the cell's frames and its message, which says it all
(``remote_errors.show_call_error``). Every other error shows as it would have (its
own ``_render_traceback_``, or IPython's traceback).
"""

from __future__ import annotations

import sys

from ..errors import RUN_RPC_INIT, not_initialized
from ..wire import remote_errors


class RpcAdvice:
    """Registered on a shell by ``register``; ``unregister`` gives the handler slot back."""

    def __init__(self):
        self._shell = None
        self._before = None

    def register(self, shell) -> None:
        if shell.custom_exceptions:  # someone else's handler: leave it in place
            return
        self._shell = shell
        # Exception, not RuntimeError alone: a remote error comes home of its own class.
        shell.set_custom_exc((Exception,), self.handle)

    def unregister(self, shell) -> None:
        if self._shell is shell:
            shell.set_custom_exc((), None)
            self._shell = None

    @staticmethod
    def handle(shell, etype, value, tb, tb_offset=None):
        """Show ``value`` in one line if it is torch's "not initialized", else as usual."""
        # What IPython's own display keeps for %debug, which a remote error's display skips.
        sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
        if not_initialized(value):
            line = f"\x1b[31mRuntimeError\x1b[0m: {RUN_RPC_INIT}"
            shell._showtraceback(etype, RuntimeError(RUN_RPC_INIT), [line])
            return [line]
        stb = remote_errors.show_call_error(shell, etype, value, tb, tb_offset)
        if stb is None:
            stb = remote_errors.show_in_cell(shell, etype, value, tb, tb_offset)
        if stb is not None:
            return stb
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        return None
