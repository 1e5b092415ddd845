"""Objects that live in a module travel by reference and land as the receiver's own
(``nbrpc/wire/module_globals.py``); what a cell made travels by value."""

from __future__ import annotations

import ast
import os
import sys
import types

import pytest
from conftest import cell_text, execute_cells

from nbrpc.wire import module_globals

# Each form, as {label: object}; ``not_own`` names those that did not land as the
# receiving process's own object.
FORMS = '''
import logging, os, sys, types
import torch
import torch._library.simple_registry as simple_registry
import torch.distributed.rpc as rpc

def forms():
    return {"os.environ": os.environ, "os.environ.get": os.environ.get, "sys.stdout": sys.stdout,
            "sys.stdout.write": sys.stdout.write, "a logger": logging.getLogger("nbrpc.fidelity"),
            "torch.cuda": torch.cuda, "a module's registry": simple_registry.singleton}

def not_own(sent):
    here = forms()

    def same(a, b):
        if isinstance(a, types.MethodType):
            return a.__self__ is b.__self__ and a.__func__ is b.__func__
        return a is b

    return sorted(label for label, obj in sent.items() if not same(obj, here[label]))

def who(box):
    return box.who
'''


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_module_objects_land_as_the_receivers_own_both_ways(tmp_path):
    sources = [
        "%load_ext nbrpc",
        "%rpc_init -n 1",
        FORMS + "\nos.environ['NBRPC_WHO'] = 'master'\nbox = types.SimpleNamespace(who='master')",
        "%%rpc_on worker1\n" + FORMS + "\nos.environ['NBRPC_WHO'] = 'worker1'\n"
        "box = types.SimpleNamespace(who='worker1')",
        # driver -> worker1
        "print(rpc.rpc_sync('worker1', not_own, args=(forms(),)))\n"
        "print(rpc.rpc_sync('worker1', os.environ.get, args=('NBRPC_WHO',)))\n"
        "rpc.rpc_sync('worker1', sys.stdout.write, args=('written by worker1\\n',))\n"
        "print(rpc.rpc_sync('worker1', who, args=(box,)))",
        # worker1 -> driver
        "%%rpc_on worker1\n"
        "print(rpc.rpc_sync('master', not_own, args=(forms(),)))\n"
        "print(rpc.rpc_sync('master', os.environ.get, args=('NBRPC_WHO',)))\n"
        "print(rpc.rpc_sync('master', who, args=(box,)))",
        "%rpc_shutdown",
    ]
    notebook = execute_cells(tmp_path, sources)
    driver_side = cell_text(notebook.cells[4]).splitlines()
    assert ast.literal_eval(driver_side[0]) == []
    # worker1's environment, its stream (the call's output comes to the cell as worker1's),
    # and the cell's object by value
    assert driver_side[1:] == ["worker1", "[worker1] written by worker1", "master"]
    worker_side = cell_text(notebook.cells[5]).splitlines()
    assert worker_side == ["[worker1] []", "[worker1] master", "[worker1] worker1"]


def test_a_global_is_found_only_while_its_module_holds_it(monkeypatch):
    index = module_globals.ModuleGlobals()
    assert index.find(os.environ) == (os, "environ")
    assert index.find(sys.stdout) == (sys, "stdout")
    # rebound: the old object is no longer that global
    module = types.ModuleType("nbrpc_test_registry")
    module.__spec__ = types.SimpleNamespace(name="nbrpc_test_registry")
    registry = module.registry = types.SimpleNamespace(entries=[])
    monkeypatch.setitem(sys.modules, "nbrpc_test_registry", module)
    assert index.find(registry) == (module, "registry")
    module.registry = types.SimpleNamespace(entries=[])
    assert index.find(registry) is None


@pytest.mark.parametrize("value", [7, "text", (1, 2), None, 1.5])
def test_values_whose_identity_means_nothing_stay_by_value(value, monkeypatch):
    module = types.ModuleType("nbrpc_test_values")
    module.__spec__ = types.SimpleNamespace(name="nbrpc_test_values")
    module.value = value
    monkeypatch.setitem(sys.modules, "nbrpc_test_values", module)
    assert module_globals.ModuleGlobals().find(value) is None


def test_notebook_globals_and_modules_made_at_run_time_stay_by_value(monkeypatch):
    import torch

    main = types.ModuleType("__main__")
    made = types.ModuleType("made_in_a_cell")  # no __spec__: not importable elsewhere
    cell_object = main.state = made.state = types.SimpleNamespace()
    tensor = main.weights = made.weights = torch.ones(2)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setitem(sys.modules, "made_in_a_cell", made)
    index = module_globals.ModuleGlobals()
    assert index.find(cell_object) is None and index.find(tensor) is None
