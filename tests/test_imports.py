"""The runtime stays headless, and a local cluster listens on loopback only."""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import nbrpc

FRONT_END = ("IPython", "ipywidgets")

# The layers of nbrpc/, lowest first: a module imports only from its own layer or
# those below (ARCHITECTURE.md). Flat modules and subpackages by their first name.
LAYERS = [
    ("base", {"_compat", "_util", "errors", "schemas"}),
    ("recording", {"recording"}),
    ("wire", {"wire"}),
    ("calls", {"calls"}),
    ("group", {"group"}),
    ("drawing", {"drawing"}),
    ("diagnostics", {"diagnostics"}),
    ("settings", {"settings"}),
    ("shared server", {"shared_server"}),
    ("launchers", {"launchers"}),
    ("cluster", {"cluster"}),
    ("member", {"member"}),
    ("front ends", {"kernel_ext", "widgets", "lab", "server", "cli", "__init__", "_bench"}),
]
PACKAGE = Path(nbrpc.__file__).parent
RUNTIME = ("_compat", "recording", "wire", "calls", "group", "drawing", "diagnostics", "shared_server", "launchers",
           "cluster", "member", "lab")

IMPORT_EVERYTHING = f"""
import importlib, json, pkgutil, sys
import nbrpc

def loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in {FRONT_END!r})

# Every module but the front ends (magics, widgets); iter_modules, not walk_packages:
# walking imports the packages it walks.
runtime = [m.name for m in pkgutil.iter_modules(nbrpc.__path__)
           if m.name not in ("kernel_ext", "widgets", "__main__")]
for package in {RUNTIME!r}:
    runtime += [package + "." + m.name for m in pkgutil.iter_modules([nbrpc.__path__[0] + "/" + package])]
for name in runtime:
    if not name.endswith("__main__"):
        importlib.import_module("nbrpc." + name)
headless = loaded()
widget = nbrpc.RRefGraph  # the class itself, imported on first use
is_class = isinstance(widget, type) and widget.__module__ == "nbrpc.widgets.rref_graph"
with_widgets = loaded()
importlib.import_module("nbrpc.kernel_ext.magics")
print(json.dumps({{"runtime": sorted(runtime), "headless": headless, "with_magics": loaded(),
                  "is_class": is_class, "with_widgets": with_widgets}}))
"""


def test_runtime_imports_no_ipython_or_widgets(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected = {"calls.wrappers", "cluster.cluster", "errors", "cluster.execution", "group.membership",
                "wire.serialization", "member.worker", "member.template_process", "launchers.local",
                "launchers.attach", "launchers.template", "launchers.registry", "cluster.queries",
                "cluster.control", "member.control",
                "launchers.ssh", "launchers.rendezvous", "launchers.addresses", "shared_server.limits",
                "diagnostics.rrefs", "recording.rref_ledger", "_compat.torch_compat", "settings",
                "diagnostics.autograd", "diagnostics.trace", "lab.rpc_basics", "wire.definitions",
                "wire.remote_errors", "schemas", "drawing.status_table", "drawing.report", "drawing.timeline_svg",
                "launchers.options", "cluster.cluster_options"}
    assert expected <= set(report["runtime"]), expected - set(report["runtime"])
    assert report["headless"] == []
    # nbrpc.RRefGraph is the widget class, and only asking for it imports ipywidgets
    assert report["is_class"] and "ipywidgets" in report["with_widgets"]
    # the check sees front-end imports when there are some
    assert "IPython" in report["with_magics"]


def _layer(module: str) -> int:
    """The layer of ``nbrpc.X...`` by its first name below nbrpc."""
    first = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, (_, names) in enumerate(LAYERS) if first in names)


def _imports(path: Path, root: Path) -> list[tuple[str, int]]:
    """Every nbrpc module ``path`` imports, at any depth (functions too), with its line."""
    here = list(path.relative_to(root.parent).parts)[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = ".".join(base + ([node.module] if node.module else []))
            found += [(target + "." + a.name if not node.module else target, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "nbrpc":
            found += [(node.module + "." + a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "nbrpc"]
    return found


def _layer_breaks(root: Path) -> list[str]:
    breaks = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for target, line in _imports(path, root):
            if _layer(target) > _layer(module):
                breaks.append(f"{path.relative_to(root.parent)}:{line} ({LAYERS[_layer(module)][0]}) imports "
                              f"{target} ({LAYERS[_layer(target)][0]})")
    return breaks


def test_each_layer_imports_only_its_own_and_those_below():
    assert _layer_breaks(PACKAGE) == []


def test_the_layer_check_sees_an_import_upward(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "nbrpc", ignore=shutil.ignore_patterns("__pycache__"))
    ledger = tmp_path / "nbrpc" / "recording" / "rref_ledger.py"
    ledger.write_text(ledger.read_text() + "\n\ndef _late():\n    from ..cluster import cluster\n")
    (found,) = _layer_breaks(tmp_path / "nbrpc")
    assert found.startswith("nbrpc/recording/rref_ledger.py:") and "imports nbrpc.cluster" in found


def _package_loops(root: Path) -> list[str]:
    """Loops through a package's ``__init__``: it imports one of its modules (at any depth,
    inside functions too) and that module takes a name the ``__init__`` itself defines."""
    loops = []
    for init in sorted(root.rglob("__init__.py")):
        package = ".".join(init.relative_to(root.parent).parent.parts)
        own = {p.stem for p in init.parent.glob("*.py")} | {p.name for p in init.parent.iterdir() if p.is_dir()}
        for target, _ in _imports(init, root):
            name = target[len(package) + 1:].split(".")[0] if target.startswith(package + ".") else ""
            module = init.parent / f"{name}.py"
            if name not in own or not module.exists():
                continue
            for back, line in _imports(module, root):
                taken = back[len(package) + 1:].split(".")[0] if back.startswith(package + ".") else None
                if taken is not None and taken not in own:
                    loops.append(f"{module.relative_to(root.parent)}:{line} takes {back} from the package "
                                 f"whose __init__ imports it")
    return sorted(set(loops))


def test_no_module_imports_back_from_the_init_that_imports_it():
    assert _package_loops(PACKAGE) == []


def test_the_loop_check_sees_an_import_inside_a_function(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "nbrpc", ignore=shutil.ignore_patterns("__pycache__"))
    init = tmp_path / "nbrpc" / "kernel_ext" / "__init__.py"
    init.write_text(init.read_text() + "\n\ndef hang_watch():\n    pass\n")
    magics = tmp_path / "nbrpc" / "kernel_ext" / "magics.py"
    magics.write_text(magics.read_text() + "\n\ndef _late():\n    from . import hang_watch\n")
    (found,) = _package_loops(tmp_path / "nbrpc")
    assert found.startswith("nbrpc/kernel_ext/magics.py:") and "takes nbrpc.kernel_ext.hang_watch" in found


def _module_of(target: str, root: Path) -> str | None:
    """The module file an imported name lives in (``nbrpc.a.b.Name`` -> ``nbrpc.a.b``)."""
    parts = target.split(".")
    while parts:
        path = root.parent.joinpath(*parts)
        if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
            return ".".join(parts)
        parts.pop()
    return None


def _mutual_imports(root: Path) -> list[str]:
    """Pairs of modules that import each other, typing-only imports included."""
    edges = set()
    for path in root.rglob("*.py"):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        edges |= {(module, m) for target, _ in _imports(path, root)
                  if (m := _module_of(target, root)) not in (None, module)}
    return sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b and not b.startswith(a + "."))


def test_no_two_modules_import_each_other_not_even_for_typing():
    assert _mutual_imports(PACKAGE) == []


def test_the_mutual_import_check_sees_a_typing_import(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "nbrpc", ignore=shutil.ignore_patterns("__pycache__"))
    queries = tmp_path / "nbrpc" / "cluster" / "queries.py"
    queries.write_text(queries.read_text() + "\n\nif TYPE_CHECKING:\n    from .cluster import Cluster\n")
    assert _mutual_imports(tmp_path / "nbrpc") == ["nbrpc.cluster.cluster <-> nbrpc.cluster.queries"]


def test_every_folder_of_modules_is_a_package():
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert sorted(str(f.relative_to(PACKAGE)) for f in folders if not (f / "__init__.py").exists()) == []


# Reading the environment: ``X.get(key)``/``getenv(key)`` on an environ, ``environ[key]``,
# ``key in environ``, and nbrpc's ``switched_on(key)``.
_READERS = ("get", "getenv", "switched_on")


def _environment_reads(tree: ast.AST) -> list[tuple[ast.expr, int]]:
    """(key, line) of every read of an environment variable in ``tree``."""
    def is_environ(node: ast.expr) -> bool:
        return ast.unparse(node).split(".")[-1] == "environ"

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner_is_environ = isinstance(func, ast.Attribute) and is_environ(func.value)
            if (name == "get" and owner_is_environ) or name in _READERS[1:]:
                reads.append((node.args[0], node.lineno))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
            reads.append((node.slice, node.lineno))
        elif isinstance(node, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
            if is_environ(node.comparators[-1]):
                reads.append((node.left, node.lineno))
    return reads


def _nbrpc_variable_reads(root: Path) -> list[str]:
    """Reads of an environment variable outside ``settings.py`` whose name is not a literal
    other than ``NBRPC_*`` (a name held in a constant could be one of nbrpc's)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "settings.py":
            continue
        for key, line in _environment_reads(ast.parse(path.read_text())):
            literal = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None
            if literal is None or literal.startswith("NBRPC_"):
                found.append(f"{path.relative_to(root.parent)}:{line} reads {ast.unparse(key)}")
    return found


def test_only_settings_reads_nbrpc_variables():
    assert _nbrpc_variable_reads(PACKAGE) == []


def test_the_variable_check_sees_a_read_elsewhere(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "nbrpc", ignore=shutil.ignore_patterns("__pycache__"))
    clocks = tmp_path / "nbrpc" / "recording" / "clocks.py"
    clocks.write_text(clocks.read_text() + "\n\ndef _skew():\n    import os\n"
                      "    return os.environ.get('NBRPC_CLOCK_SKEW'), 'NBRPC_X' in os.environ\n")
    registry = tmp_path / "nbrpc" / "launchers" / "registry.py"
    registry.write_text(registry.read_text() + "\n\ndef _named():\n    return os.environ[LAUNCHER_ENV]\n")
    found = _nbrpc_variable_reads(tmp_path / "nbrpc")
    assert [f.split(":")[0] for f in found] == ["nbrpc/launchers/registry.py"] + ["nbrpc/recording/clocks.py"] * 2
    assert found[0].endswith("reads LAUNCHER_ENV") and found[1].endswith("reads 'NBRPC_CLOCK_SKEW'")


def test_modules_stay_small_and_few_stay_flat():
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 450} == {}
    assert len([name for name in sizes if "/" not in name]) <= 8, sorted(sizes)


# -- listening sockets -------------------------------------------------------------


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def decode_address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6}: hex, in 32-bit words of host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def proc_listeners(pids: list[int]) -> dict[int, list[tuple[str, int]]]:
    """(address, port) of every listening TCP socket of each pid, from /proc."""
    listening = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pids[0]}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], int(fields[9])
                if state == "0A":  # LISTEN
                    address, port = local.split(":")
                    listening[inode] = (decode_address(address), int(port, 16))
    return {pid: sorted(listening[i] for i in socket_inodes(pid) if i in listening) for pid in pids}


def ss_listeners(pids: list[int]) -> dict[int, list[tuple[str, int]]]:
    """The same, as ``ss -ltnp`` reports it."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = {pid: [] for pid in pids}
    for line in out.splitlines():
        fields = line.split()
        address, port = fields[3].rsplit(":", 1)
        address = address.strip("[]").split("%")[0]
        if address == "*":  # ss's wildcard: every address of either family
            address = "::"
        for pid in pids:
            if f"pid={pid}," in line:
                found[pid].append((address, int(port)))
    return {pid: sorted(found[pid]) for pid in pids}


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


@pytest.mark.parametrize("source", ["proc", "ss"])
def test_local_cluster_listens_on_loopback_only(cluster, source):
    if source == "ss" and shutil.which("ss") is None:
        pytest.skip("ss is not installed; the /proc check covers this")
    workers = {w.pid: w.name for w in cluster.workers}
    pids = [os.getpid(), *workers]
    listeners = (proc_listeners if source == "proc" else ss_listeners)(pids)
    # The driver hosts the rendezvous store and a TensorPipe listener; each worker
    # kernel has its five ZMQ ports and a TensorPipe listener.
    assert len(listeners[os.getpid()]) >= 2, listeners
    for pid in workers:
        assert len(listeners[pid]) >= 6, (workers[pid], listeners[pid])
    exposed = {pid: [a for a in found if not is_loopback(a[0])] for pid, found in listeners.items()}
    assert exposed == {pid: [] for pid in pids}, listeners


@pytest.mark.parametrize("source", ["proc", "ss"])
def test_listener_scan_sees_other_addresses(source):
    if source == "ss" and shutil.which("ss") is None:
        pytest.skip("ss is not installed")
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        with socket.socket(family, socket.SOCK_STREAM) as exposed:
            exposed.bind((address, 0))
            exposed.listen(1)
            port = exposed.getsockname()[1]
            found = (proc_listeners if source == "proc" else ss_listeners)([os.getpid()])
            (seen,) = [a for a, p in found[os.getpid()] if p == port]
            assert ipaddress.ip_address(seen) == ipaddress.ip_address(address)
            assert not is_loopback(seen)


# -- torch's private names, in _compat only ------------------------------------------


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _torchs_marks() -> set[str]:
    """The private names torch's RPC and distributed autograd read off objects they are
    given or import (``func._wrapped_async_rpc_function``, ``rref._get_type``,
    ``hasattr(x, "_...")``): a module of nbrpc that sets, reads or spells one uses torch's
    internals, whatever the object's name there."""
    import torch.distributed

    marks = set()
    folder = Path(torch.distributed.__file__).parent
    for path in [*(folder / "rpc").glob("*.py"), *(folder / "autograd").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                marks.add(node.attr)
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("hasattr", "getattr", "setattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and _private(str(node.args[1].value))):
                marks.add(node.args[1].value)
    return marks


def _torchs_pickler_names() -> set[str]:
    """The private names of torch's RPC pickler (its tables and reducers): nbrpc's
    ``serialize`` runs as its method, so even ``self._...`` there is torch's."""
    from torch.distributed.rpc import internal

    pickler = internal._InternalRPCPickler()
    return {name for name in {*vars(type(pickler)), *vars(pickler)} if _private(name) and not name.endswith("__")}


def _torch_names(tree: ast.AST) -> tuple[set[str], list[tuple[int, str]]]:
    """The names a module binds to torch's modules and objects, and its imports of torch's
    private modules or names."""
    bound, private = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    bound.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(part) for part in alias.name.split(".")):
                        private.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                if _private(alias.name) or any(_private(part) for part in node.module.split(".")):
                    private.append((node.lineno, f"from {node.module} import {alias.name}"))
    return bound, private


def _private_torch_uses(root: Path) -> list[str]:
    """Each line of ``root`` (a copy of nbrpc/) outside ``_compat`` that uses a private
    name of torch: an import of one, an attribute of torch's modules or objects, or one of
    the names torch's RPC reads off objects (``_torchs_marks``) set, read or spelled."""
    marks, pickler_names = _torchs_marks(), _torchs_pickler_names()
    found = []
    for path in sorted(root.rglob("*.py")):
        if "_compat" in path.relative_to(root).parts:
            continue
        tree = ast.parse(path.read_text())
        bound, uses = _torch_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                on_torch = isinstance(base, ast.Name) and base.id in bound and _private(node.attr)
                on_object = node.attr in pickler_names or node.attr in marks and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                if on_torch or on_object:
                    uses.append((node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.ClassDef):  # a class attribute named as torch's mark
                uses += [(item.lineno, target.id) for item in node.body if isinstance(item, ast.Assign)
                         for target in item.targets if isinstance(target, ast.Name) and target.id in marks]
            elif isinstance(node, ast.Constant) and node.value in marks:
                uses.append((node.lineno, repr(node.value)))
        found += [f"{path.relative_to(root.parent)}:{line}: {text}" for line, text in sorted(set(uses))]
    return found


def test_torchs_private_names_are_used_in_compat_only():
    # each is a named function or constant of nbrpc/_compat/torch_compat.py, which
    # tests/test_compat.py reads
    assert _private_torch_uses(PACKAGE) == []


def test_the_private_name_check_sees_each_way_of_using_one(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "nbrpc", ignore=shutil.ignore_patterns("__pycache__"))
    module = tmp_path / "nbrpc" / "calls" / "fanout.py"
    module.write_text(module.read_text() + '''

from torch._C import _distributed_rpc


def _reach(rref, func):
    rpc.api._get_current_rpc_agent()
    rref._get_type()
    func._wrapped_async_rpc_function = func
    return hasattr(func, "_wrapped_async_rpc_function")


class _Marked:
    _wrapped_async_rpc_function = True


def _serialize(self, obj):
    return self._dispatch_table
''')
    found = [line.split(": ", 1)[1] for line in _private_torch_uses(tmp_path / "nbrpc")]
    assert found == ["from torch._C import _distributed_rpc", "rpc.api._get_current_rpc_agent",
                     "rref._get_type", "func._wrapped_async_rpc_function", "'_wrapped_async_rpc_function'",
                     "_wrapped_async_rpc_function", "self._dispatch_table"], found
