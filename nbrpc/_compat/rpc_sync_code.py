"""torch's own ``rpc_sync`` code, run with another ``_invoke_rpc``: a call that raises
lists torch's frames in its traceback, where a script's are; known to work with torch
2.11 to 2.15 (``tests/test_compat.py`` checks the body's shape)."""

from __future__ import annotations

import types

from torch.distributed.rpc import api


def rpc_sync_invoking(invoke) -> types.FunctionType:
    """torch's ``rpc_sync``, its code run with ``invoke`` for its ``_invoke_rpc`` (whose
    result it returns the ``wait()`` of: ``fut = _invoke_rpc(...); return fut.wait()``),
    behind torch's ``_require_initialized``."""
    torchs = api.rpc_sync.__wrapped__
    made = types.FunctionType(torchs.__code__, {**torchs.__globals__, "_invoke_rpc": invoke},
                              torchs.__name__, torchs.__defaults__)
    made.__doc__, made.__kwdefaults__ = torchs.__doc__, torchs.__kwdefaults__
    return api._require_initialized(made)
