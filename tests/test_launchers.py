"""The launcher registry and the options each launcher declares once, for ``Cluster``
and ``%rpc_init`` alike (``nbrpc.launchers``, ``launchers.options``, ``cluster.cluster_options``)."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest
from IPython.core.error import UsageError

import nbrpc
from nbrpc.cluster.cluster_options import DEFAULTS, ClusterOptions
from nbrpc.launchers import options
from nbrpc.launchers import registry as launchers
from nbrpc.launchers.slurm_options import SlurmOptions

PLUGIN = """
from dataclasses import dataclass

from nbrpc.launchers.registry import Kind
from nbrpc.launchers.local import LocalLauncher
from nbrpc.launchers.options import check_names, option, worker_names


@dataclass
class PodOptions:
    pods: int | None = option(None, "start N workers as pods", type=int, metavar="N")
    image: str = option("nbrpc:latest", "the pods' image")

    def __post_init__(self):
        if not isinstance(self.pods, int) or self.pods < 1:
            raise ValueError(f"pods must be a whole number >= 1, got {self.pods!r}")


def make(request, opts):
    names = worker_names(opts.pods, request.names)
    check_names(names, request.driver_name)
    launcher = LocalLauncher(names, request.warm_start)
    launcher.image = opts.image
    return launcher


KIND = Kind("pods", "pods", PodOptions, make)
NOT_A_KIND = "pods"
"""


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A package with a launcher, installed the way pip leaves one (a dist-info with
    entry points) on ``sys.path``."""

    def install(target: str = "nbrpc_pods:KIND") -> None:
        (tmp_path / "nbrpc_pods.py").write_text(textwrap.dedent(PLUGIN))
        info = tmp_path / "nbrpc_pods-1.0.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nbrpc-pods\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[nbrpc.launchers]\npods = {target}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()

    yield install
    sys.modules.pop("nbrpc_pods", None)


def test_the_built_in_launchers_are_a_registry():
    kinds = launchers.kinds()
    assert list(kinds)[:4] == ["local", "attach", "ssh", "slurm"]
    assert [kinds[k].key for k in ("local", "attach", "ssh", "slurm")] == [None, "attach", "hosts", "slurm"]
    request = launchers.Request(2, None, "master", False)
    assert type(launchers.choose(request)).__name__ == "LocalLauncher"
    assert type(launchers.choose(request.__class__(None, None, "master", False), attach=0)).__name__ \
        == "AttachLauncher"


def test_a_third_party_launcher_is_found_by_its_entry_point(installed):
    installed()
    kinds = launchers.kinds()
    assert kinds["pods"].options.__name__ == "PodOptions"
    cluster = nbrpc.Cluster(pods=3, image="mine:1")
    assert [w.name for w in cluster.workers] == ["worker1", "worker2", "worker3"]
    assert cluster.launcher.image == "mine:1"
    # its options check themselves, and belong to it only
    with pytest.raises(ValueError, match="pods must be a whole number >= 1, got 0"):
        nbrpc.Cluster(pods=0)
    with pytest.raises(ValueError, match="image is not an option of the local launcher"):
        nbrpc.Cluster(2, image="mine:1")
    with pytest.raises(ValueError, match=r"give attach=\.\.\. or pods=\.\.\., not both"):
        nbrpc.Cluster(pods=2, attach=1)


def test_an_entry_point_that_names_no_launcher_is_refused(installed):
    installed("nbrpc_pods:NOT_A_KIND")
    with pytest.raises(TypeError, match=r"entry point 'pods' of 'nbrpc.launchers' must name an "
                                        r"nbrpc.launchers.registry.Kind, got 'pods'"):
        launchers.kinds()


@pytest.mark.parametrize("make, message", [
    (lambda: options.AttachOptions(attach=True), "attach must be the number of workers"),
    (lambda: options.AttachOptions(attach=1, port=True), "port must be a number from 0"),
    (lambda: options.SshOptions(hosts=""), "hosts is empty"),
    (lambda: options.SshOptions(hosts="a:0"), "bad host entry 'a:0'"),
    (lambda: ClusterOptions(threads=0), "threads must be a positive number, got 0"),
    (lambda: ClusterOptions(timeout=True), "timeout must be a positive number, got True"),
    (lambda: ClusterOptions(transport="tcp"), "transport must be one of 'uv', 'shm', got 'tcp'"),
])
def test_options_check_themselves(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_names_are_parsed_and_checked_once_for_every_launcher():
    assert options.parse_names(" a, b ,,c") == ["a", "b", "c"] and options.parse_names(None) is None
    assert options.worker_names(None, None) == ["worker1", "worker2"]
    for where in (dict(names="x,x"), dict(attach=1, names="x,x"), dict(hosts="h1,h2", names="x,x")):
        with pytest.raises(ValueError, match="worker names must be unique; repeated: x"):
            nbrpc.Cluster(**where)
    with pytest.raises(ValueError, match="worker names must be unique; repeated: master"):
        nbrpc.Cluster(names="master")


def test_each_option_is_declared_once_for_the_magic_and_the_api(ip):
    """%rpc_init's flags are the options' declarations: the same names, defaults and checks."""
    ip.run_line_magic("load_ext", "nbrpc")
    parser = ip.magics_manager.registry["RpcMagics"].rpc_init.parser
    flags = {a.dest: a for a in parser._actions}
    declared = [ClusterOptions, options.AttachOptions, options.SshOptions, SlurmOptions]
    for options_class in declared:
        for name, flag, settings in options.flags(options_class):
            assert flag in flags[name].option_strings and flags[name].help == settings["help"]
            assert flags[name].default is None  # left out: the dataclass's default
    assert flags["transport"].choices == ("uv", "shm") and DEFAULTS.transport is None
    assert flags["args"].option_strings == ["--slurm-args"]
    assert parser.parse_args(["--torch-threads-only"]).torch_threads_only is True
    assert parser.parse_args([]).torch_threads_only is None and DEFAULTS.torch_threads_only is False
    with pytest.raises(UsageError, match="threads must be a positive number, got 0"):
        ip.run_line_magic("rpc_init", "-n 1 --threads 0")
    with pytest.raises(UsageError, match="port must be a number from 0"):
        ip.run_line_magic("rpc_init", "--attach 1 --bind 127.0.0.1 --port 70000")
    assert nbrpc.current() is None


def test_the_servers_default_launcher_is_the_one_nbrpc_launcher_names(ip, monkeypatch):
    """A hub whose servers are Slurm jobs sets NBRPC_LAUNCHER=slurm once for everyone
    (tests/test_batchspawner.py runs it); what a cluster asks for wins."""
    request = launchers.Request(2, None, "master", False)
    given = {}
    monkeypatch.setenv("NBRPC_LAUNCHER", "slurm")
    assert launchers.default_kind(launchers.kinds(), given).name == "slurm" and given == {"slurm": True}
    assert type(launchers.choose(request.__class__(None, None, "master", False), attach=0)).__name__ \
        == "AttachLauncher"
    # %rpc_init's Slurm flags need no --slurm where Slurm is the server's default.
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # stops at the launcher's own check, before anything starts
    ip.run_line_magic("load_ext", "nbrpc")
    with pytest.raises(UsageError, match="no sbatch on the PATH"):
        ip.run_line_magic("rpc_init", "-n 2 --partition debug")
    monkeypatch.setenv("NBRPC_LAUNCHER", "local")
    with pytest.raises(UsageError, match="--partition is for Slurm jobs: add --slurm"):
        ip.run_line_magic("rpc_init", "-n 2 --partition debug")
    assert type(launchers.choose(request)).__name__ == "LocalLauncher"
    for value, says in (("pods", r"NBRPC_LAUNCHER='pods' names no launcher; the known ones are attach, "
                                 r"local, slurm, ssh\. The server's administrator sets it"),
                        ("ssh", r"NBRPC_LAUNCHER='ssh': the ssh launcher cannot start workers without "
                                r"options of its own; name local or slurm")):
        monkeypatch.setenv("NBRPC_LAUNCHER", value)
        with pytest.raises(ValueError, match=says):
            nbrpc.Cluster(2)
