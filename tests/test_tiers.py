"""CI's tiers are lists in tests/conftest.py (``SERIAL``, ``ONE_AT_A_TIME``, ``BESIDE``, ``TORCH_VERSION``):
each entry names a test file (or a file's class) that exists, so a renamed file cannot slip
into the wrong tier."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import conftest
import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.parametrize("entry", sorted(conftest.SERIAL | conftest.ONE_AT_A_TIME_FILES | conftest.BESIDE
                                          | conftest.TORCH_VERSION))
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


def test_files_that_need_a_browser_a_hub_or_namespaces_never_run_beside_their_kind():
    """Real users with fixed names and a hub, Slurm, network namespaces: such a file runs
    alone or one at a time among its kind; Chromium's timings, alone (unless it is a hub's)."""
    assert not conftest.SERIAL & conftest.ONE_AT_A_TIME_FILES
    # What runs beside the serial tests at the idle priority shares nothing and times nothing.
    assert not conftest.BESIDE & (conftest.SERIAL | conftest.ONE_AT_A_TIME_FILES)
    assert sum(map(len, conftest.ONE_AT_A_TIME.values())) == len(conftest.ONE_AT_A_TIME_FILES)  # one kind each
    for path in sorted(TESTS.glob("test_*.py")):
        marks = {n.attr for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}
        if marks & {"hub", "netns"}:
            listed = conftest.SERIAL | conftest.ONE_AT_A_TIME_FILES
            assert path.name in listed, f"{path.name} is marked {sorted(marks)}: list it"
        elif "browser" in marks:
            assert path.name in conftest.SERIAL, f"{path.name} is marked browser: list it in SERIAL"


def test_a_file_is_one_xdist_unit_and_the_one_at_a_time_files_one_together():
    """xdist hands a process a whole file (its tests and its shared cluster stay there),
    and the ONE_AT_A_TIME files of a kind as one unit, run one after another."""
    assert conftest.xdist_scope("tests/test_calls.py::test_x[a::b]") == "tests/test_calls.py"
    assert conftest.xdist_scope("tests/test_hub.py::test_x") == conftest.xdist_scope("tests/test_batchspawner.py::t")
    assert conftest.xdist_scope("tests/test_netns.py::t") == conftest.xdist_scope("tests/test_lab_debugger_hosts.py::t")
    assert conftest.xdist_scope("tests/test_netns.py::t") not in {conftest.xdist_scope("tests/test_hub.py::t"),
                                                                  conftest.xdist_scope("tests/test_attach.py::t")}


@pytest.mark.parametrize(("expression", "collected", "left_out"), [
    ("serial and machine_wide", {"test_limits.py"}, {"test_calls.py", "test_labs.py", "test_nbgrader.py"}),
    # test_labs.py is serial in one class only: it is collected for both
    ("serial and not machine_wide", {"test_calls.py", "test_labs.py"}, {"test_limits.py", "test_nbgrader.py"}),
    ("not serial and not beside", {"test_nbgrader.py", "test_labs.py"}, {"test_calls.py", "test_upstream.py"}),
    # markers given in the files themselves (gpu, browser, hub, slow) may be either
    ("torch_version and not gpu and not browser and not netns and not hub and serial",
     {"test_calls.py", "test_differential.py"}, {"test_nbgrader.py", "test_upstream.py", "test_limits.py"}),
    ("slow or beside", {"test_calls.py", "test_upstream.py"}, set()),
    # anything but plain marker names and and/or/not: every file, as pytest decides
    ("serial in beside", {"test_calls.py", "test_nbgrader.py"}, set()),
    ("", {"test_calls.py", "test_nbgrader.py"}, set()),
])
def test_a_file_no_test_of_the_expression_can_come_from_is_not_imported(request, monkeypatch, expression,
                                                                        collected, left_out):
    monkeypatch.setattr(request.config.option, "markexpr", expression)
    ignored = {name: conftest.pytest_ignore_collect(TESTS / name, request.config) for name in collected | left_out}
    assert ignored == {**dict.fromkeys(collected), **dict.fromkeys(left_out, True)}
    assert conftest.pytest_ignore_collect(TESTS / "upstream" / "rl.py", request.config) is None


def test_the_units_handed_out_first_exist():
    for scope in conftest.LONGEST_FIRST:
        assert scope in conftest.ONE_AT_A_TIME or (TESTS.parent / scope).is_file(), scope


def test_what_runs_beside_the_serial_tests_yields_them_the_cpu_and_its_failure_counts(tmp_path):
    """.ci/beside.sh: the serial tests (the command) at their own priority, BESIDE at the idle
    one (SCHED_IDLE); BESIDE's output after the command's; a failure of either fails the whole."""
    script = str(TESTS.parent / ".ci" / "beside.sh")
    policy = "$(chrt -p $$ | grep -o 'SCHED_[A-Z]*')"
    run = subprocess.run(["bash", script, f"echo beside at {policy}; exit 3",
                          "bash", "-c", f"sleep 0.5; echo serial at {policy}"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert run.returncode == 3, run
    assert "serial at SCHED_OTHER\n" in run.stdout and "beside at SCHED_IDLE\n" in run.stdout, run.stdout
    assert run.stdout.index("serial at") < run.stdout.index("beside at"), run.stdout
    assert subprocess.run(["bash", script, "exit 0", "bash", "-c", "exit 4"], cwd=tmp_path, timeout=30).returncode == 4
