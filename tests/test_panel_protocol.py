"""The side panel's protocol is written once: the TypeScript's lists, the driver kernel's
names and the server's are ``nbrpc_server.protocol``'s."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from nbrpc_server import protocol

SOURCE = Path(__file__).resolve().parent.parent / "labextension" / "src"


def ts_list(text: str, name: str) -> str:
    """The text of the array literal ``export const <name> ... = [ ... ]``."""
    found = re.search(rf"export const {name}\b[^=]*=\s*\[(.*?)\]", text, re.S)
    assert found, f"no list {name} in the TypeScript"
    return found.group(1)


def test_the_typescript_views_are_the_protocols():
    views = ts_list((SOURCE / "protocol.ts").read_text(), "VIEWS")
    assert tuple(re.findall(r"name:\s*'([a-z]+)'", views)) == protocol.VIEWS


def test_the_typescript_view_options_are_the_protocols():
    options = ts_list((SOURCE / "protocol.ts").read_text(), "VIEW_OPTIONS")
    assert tuple(re.findall(r"'([a-z_]+)'", options)) == protocol.VIEW_OPTIONS


def test_the_typescript_member_columns_are_the_protocols():
    columns = ts_list((SOURCE / "protocol.ts").read_text(), "MEMBER_COLUMNS")
    assert tuple(re.findall(r"'([a-z_]+)'", columns)) == protocol.MEMBER_COLUMNS
    member = re.search(r"interface IMember \{(.*?)\}", (SOURCE / "api.ts").read_text(), re.S).group(1)
    assert tuple(re.findall(r"^\s*([a-z_]+):", member, re.M)) == protocol.MEMBER_COLUMNS


def test_the_kernel_and_the_server_use_the_protocols_names():
    import nbrpc_server.drivers as drivers
    from nbrpc.kernel_ext import panel

    assert (panel.REQUEST, panel.REPLY, panel.VIEWS) == (protocol.REQUEST, protocol.REPLY, protocol.VIEWS)
    assert drivers.REQUEST == protocol.REQUEST
    assert panel.Beacon("/tmp/kernel-1.json").path == protocol.beacon_path("/tmp/kernel-1.json")
    assert protocol.beacon_path("/run/kernel-1.json").name == "nbrpc-kernel-1.json"


@pytest.mark.parametrize("line", ["", "import os", "%rpc_shutdown", "%rpc_init -n 2\nimport os", "%rpc_initx -n 2"])
def test_the_start_runs_only_an_rpc_init_line(line):
    with pytest.raises(ValueError, match="one line beginning with %rpc_init"):
        protocol.start_code(line)


def test_the_start_is_what_a_user_would_type():
    assert protocol.start_code(" %rpc_init -n 2 --trace ") == "%load_ext nbrpc\n%rpc_init -n 2 --trace"


def test_the_protocol_imports_nothing_heavy():
    import subprocess

    code = "import sys, nbrpc_server.protocol; print(sorted(m for m in ('torch', 'nbrpc') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
