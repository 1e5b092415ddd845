"""``make bench`` fails when a target row fails: the verdict and each script's status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def run_module():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import run
        yield run
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_verdict_names_each_missed_target_and_fails(run_module, capsys):
    assert run_module.verdict(["rpc_sync latency", "startup.py: a target missed"]) == 1
    out = capsys.readouterr().out
    assert "2 targets missed" in out
    assert "FAIL  rpc_sync latency" in out and "FAIL  startup.py: a target missed" in out


def test_verdict_passes_when_every_target_is_met(run_module, capsys):
    assert run_module.verdict([]) == 0
    assert "every target met" in capsys.readouterr().out


def test_rows_that_miss_their_bound_fail(run_module):
    assert run_module._row("x", 1.06, 1.0, "nbrpc/raw", "<=", 1.05)["pass"] is False
    assert run_module._row("x", 1.04, 1.0, "nbrpc/raw", "<=", 1.05)["pass"] is True
    assert run_module._row("x", 1.5, 1.0, "nbrpc/raw", "<=", None)["pass"] is None
    assert run_module._limit_row("x", 31.0, 60.0, 30.0)["pass"] is False


def test_a_script_that_misses_a_target_counts_once(run_module, tmp_path, monkeypatch):
    for name, status in (("miss.py", 1), ("crash.py", 2), ("ok.py", 0)):
        (tmp_path / name).write_text(f"import sys; sys.exit({status})\n")
    monkeypatch.setattr(run_module, "HERE", tmp_path)
    assert run_module._script("ok.py") == []
    assert run_module._script("miss.py") == ["miss.py: a target missed (see its table)"]
    assert run_module._script("crash.py") == ["crash.py: failed to run (exit 2)"]


def test_make_bench_passes_the_failure_on(tmp_path):
    """The Makefile's recipe: run.py's status survives the CUDA script that follows it."""
    recipe = next(line.strip() for line in (BENCHMARKS.parent / "Makefile").read_text().splitlines()
                  if "benchmarks/run.py" in line)
    for status in (0, 1):
        command = (recipe.replace("$$", "$").replace("$(PY) benchmarks/run.py", f"(exit {status})")
                   .replace("$(PY) benchmarks/cuda_rpc.py", "true"))
        assert subprocess.run(["bash", "-c", command]).returncode == status
