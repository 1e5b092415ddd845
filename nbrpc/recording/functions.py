"""What ran in a recorded call: a function's name and the kind of call it makes,
looked up once per function; where a call went (``destination_name``)."""

from __future__ import annotations

import types

import torch

from .._compat import torch_compat

DESCRIPTIONS_KEPT = 4096  # functions whose name and kind are remembered per member
# The functions an RRef helper runs on the owner, named per call by the RRef's type and method.
RREF_HELPERS = torch_compat.RREF_HELPERS
# Functions that live as long as their process: described once, by themselves.
_LASTING = (type, types.BuiltinFunctionType, torch.jit.ScriptFunction)
# ``_remembered`` per function, by code object for Python functions.
_descriptions: dict = {}


def describe(func) -> tuple[str, str | None, bool, bool, str | None]:
    """``func``'s name, the kind of call it makes if special, whether torch pickles the
    arguments itself, whether its arguments say more, and its ``__qualname__``."""
    try:
        found = _descriptions.get(getattr(func, "__code__", func))
    except TypeError:  # a callable object that cannot be a dict key
        found = None
    if found is None or found[4] != getattr(func, "__qualname__", None):
        found = _remembered(func)
    return found


def _remembered(func) -> tuple[str, str | None, bool, bool, str | None]:
    """``_describe(func)`` and the ``__qualname__`` it was made for, remembered for the
    next calls: by code object for a Python function (a closure made anew for each
    call shares it, and is not kept alive by it; functions that share a decorator's
    code differ in name), by itself for a class, builtin or TorchScript function."""
    found = (*_describe(func), getattr(func, "__qualname__", None))
    key = getattr(func, "__code__", None)
    if key is None and isinstance(func, _LASTING):
        key = func
    if key is not None and found[4] is not None:
        if len(_descriptions) >= DESCRIPTIONS_KEPT:
            _descriptions.clear()
        _descriptions[key] = found
    return found


def _describe(func) -> tuple[str, str | None, bool, bool]:
    """Name of ``func``, the kind of call it makes if special, whether torch pickles
    the arguments itself (a builtin, a TorchScript function), and whether its
    arguments say more (``_look_at_arguments``)."""
    builtin = torch_compat.find_builtin(func)
    if builtin is not None:
        return builtin, None, True, True
    if func in RREF_HELPERS:
        return "", "rref_helper", False, True  # named per call, by the RRef's type and method
    if isinstance(func, torch.jit.ScriptFunction):  # "__torch__.module.name"
        name = func.qualified_name
        return name.removeprefix("__torch__."), _internal(name), True, True
    name = getattr(func, "__qualname__", None) or repr(func)
    kind = _internal(getattr(func, "__module__", None) or "")
    return name, kind, False, kind is not None


def own(func) -> bool:
    """Whether ``func`` is nbrpc's own (its status, snapshots, fan-outs): a call of it is
    not the user's, so no recording shows it. The labs' functions are the user's."""
    module = getattr(func, "__module__", None) or ""
    return module.startswith("nbrpc.") and not module.startswith("nbrpc.lab")


def _internal(module: str) -> str | None:
    """torch's own functions (``_rref_typeof_on_owner``...) make internal calls."""
    return "internal" if module.removeprefix("__torch__.").startswith("torch.distributed") else None



_LOCAL_INVOKE, _LOCAL_INVOKE_ASYNC = RREF_HELPERS


def named(func, args, here: bool = False):
    """``func``, or for torch's helper behind an RRef's proxy (``rref.rpc_sync().take()``
    sends ``_local_invoke``) the method it calls, as "Box.take" (``here``: on the RRef's
    owner). Two identity checks on an ordinary call."""
    if func is not _LOCAL_INVOKE and func is not _LOCAL_INVOKE_ASYNC or not args:
        return func
    if not here:
        return helper_name(args[0], args[1])
    try:
        return f"{type(args[0].local_value()).__qualname__}.{args[1]}"
    except Exception:
        return f"RRef.{args[1]}"


def helper_name(rref, method: str) -> str:
    try:
        return f"{torch_compat.rref_type(rref).__qualname__}.{method}"
    except Exception:
        return f"RRef.{method}"


def destination_name(to) -> str:
    """The worker name of a call's destination, given as ``rpc_sync`` and the others take
    it: a name, a ``WorkerInfo``, or a rank (its name as torch's agent knows it; the rank
    itself, as text, where no agent knows it)."""
    if isinstance(to, str):
        return to
    name = getattr(to, "name", None)
    if name is not None:
        return name
    try:
        return torch_compat.current_agent().get_worker_info(to).name
    except (RuntimeError, TypeError, ValueError):
        return str(to)
