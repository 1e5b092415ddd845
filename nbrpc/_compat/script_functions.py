"""TorchScript functions compiled from their source under a name nbrpc chooses.

torch sends a ``ScriptFunction`` by its qualified name, which the callee looks up in its
own compilation unit. A function compiled again in one process (a cell run a second time)
gets a mangled name (``__torch__.___torch_mangle_N.f``, N counting every mangle in that
process), which another process has only by chance. ``source_of`` takes what a process
needs to compile the same function (its Python source, where it was written, its
defaults, its module); ``compile_as`` compiles it under a given name, resolving the
names it uses in that module as the process holds it, as ``torch.jit.script`` does with
the function's own globals. Private parts of torch, known to work with torch 2.11 to
2.15 (``tests/test_compat.py`` reads every one).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import textwrap
import typing
from dataclasses import dataclass

import torch
from torch import _sources
from torch._jit_internal import createResolutionCallbackFromEnv
from torch.jit._state import _python_cu
from torch.jit.frontend import get_default_args, get_jit_def

# What ``torch.jit.script`` inserts in a name it compiled before in the same process.
MANGLE_MARK = "___torch_mangle_"


@dataclass(frozen=True)
class Source:
    """What a process needs to compile a TorchScript function as another one did."""

    name: str
    module: str
    source: str
    filename: str
    first_line: int
    defaults: dict
    uses: tuple = ()  # (global name, qualified name): a TorchScript function it calls, by its name here


def python_function(script: torch.jit.ScriptFunction):
    """The Python function ``torch.jit.script`` compiled ``script`` from, or None."""
    return getattr(script, "_torchdynamo_inline", None)


def source_of(script: torch.jit.ScriptFunction, uses: tuple = ()) -> Source | None:
    """``script``'s source as torch reads it, or None where it has none (compiled from a
    string, or its file is gone); ``uses``: see ``Source``."""
    func = python_function(script)
    if func is None:
        return None
    try:
        lines, first_line, filename = _sources.get_source_lines_and_file(func)
    except (OSError, TypeError):
        return None
    source = "".join(_sources.normalize_source_lines(lines))
    return Source(func.__name__, func.__module__, source, filename, first_line, get_default_args(func), uses)


def find(qualified_name: str) -> torch.jit.ScriptFunction | None:
    """This process's TorchScript function of that name, or None."""
    return _python_cu.find_function(qualified_name)


def compile_as(qualified_name: str, found: Source) -> torch.jit.ScriptFunction:
    """``found`` compiled under ``qualified_name`` (which this process does not hold yet),
    the names it uses resolved as ``found.uses`` says, else in its module here, then in
    typing's and the builtins."""
    dedented = textwrap.dedent(found.source)
    tree = ast.parse(dedented)
    indent = len(found.source.split("\n", 1)[0]) - len(dedented.split("\n", 1)[0])
    context = _sources.make_source_context(found.source, found.filename, found.first_line, indent, True, found.name)
    parsed = _sources.ParsedDef(tree, context, found.source, found.filename, found.first_line)
    definition = get_jit_def(parsed, found.name)
    scope = {**vars(importlib.import_module(found.module)), **{name: find(used) for name, used in found.uses}}
    resolve = createResolutionCallbackFromEnv(_Names(scope))
    return torch._C._jit_script_compile(qualified_name, definition, resolve, found.defaults)


class _Names:
    """A module's globals, then typing's and the builtins (what torch's own resolution
    of a function's globals falls back on)."""

    def __init__(self, scope: dict):
        self._scope = scope

    def __getattr__(self, name: str):
        for scope in (self._scope, vars(typing), vars(builtins)):
            if name in scope:
                return scope[name]
        return None
