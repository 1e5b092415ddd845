"""CI's tiers are lists in tests/conftest.py (``SERIAL``, ``TORCH_VERSION``): each entry names
a test file (or a file's class) that exists, so a renamed file cannot slip into the wrong tier."""

from __future__ import annotations

import ast
from pathlib import Path

import conftest
import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("entry", sorted(conftest.SERIAL | conftest.TORCH_VERSION))
def test_every_tier_entry_names_a_test_file_or_class(entry):
    file, _, cls = entry.partition("::")
    path = TESTS / file
    assert path.is_file(), f"{entry}: no tests/{file}"
    if cls:
        classes = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
        assert cls in classes, f"{entry}: no class {cls} in tests/{file}"


def test_a_test_marks_itself_serial_too(request):
    """The lists mark whole files; a marker in a file works as well (pyproject.toml declares both)."""
    markers = request.config.getini("markers")
    assert any(m.startswith("serial:") for m in markers) and any(m.startswith("torch_version:") for m in markers)


def test_files_that_need_a_browser_a_hub_or_namespaces_run_alone():
    """Chromium with a Jupyter server, real users with fixed names and a hub, network
    namespaces: such a file never runs beside another."""
    machine_wide = {"browser", "hub", "netns"}
    for path in sorted(TESTS.glob("test_*.py")):
        marks = {n.attr for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
        if marks & machine_wide:
            assert path.name in conftest.SERIAL, f"{path.name} is marked {sorted(marks & machine_wide)}: list it"
