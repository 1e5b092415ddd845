"""The benchmarks' results file, its report and the regression gate, on real result files
(``benchmarks/results.json`` and ``benchmarks/baseline.json`` come from real runs)."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ROW_KEYS = {"id", "what", "unit", "nbrpc", "reference", "reference_name", "ratio", "target", "met", "reason"}
TOP_KEYS = {"machine", "torch", "nbrpc", "date", "spread", "rows"}


@pytest.fixture(scope="module")
def bench():
    """The benchmark modules, imported as ``run.py`` imports them (from their folder)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name) for name in ("results", "report", "gate", "targets", "user")}
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def run(bench):
    return bench["results"].read(BENCHMARKS / "results.json")


def test_the_results_file_has_the_schema_the_docs_read(run, bench):
    assert TOP_KEYS <= set(run) and {"cpu", "cores", "memory_gib", "load_before", "load_after"} <= set(run["machine"])
    assert run["complete"] and not run["quick"], "commit results of a full run"
    targets = bench["targets"].load()
    for row in run["rows"]:
        assert ROW_KEYS <= set(row), row["id"]
        target = targets[row["id"]]
        assert row["reason"] == target.reason and row["target"] == (target.text() or "")
        assert row["met"] == target.met(row["nbrpc"], row["reference"], row["ratio"]), row["id"]
    ids = {row["id"] for row in run["rows"]}
    assert {"rpc_sync", "spread", "user_kernel_sync", "user_script_sync", "user_kernel_tensor"} <= ids
    assert run["spread"] == next(row["ratio"] for row in run["rows"] if row["id"] == "spread")


def test_every_target_says_why_and_a_bad_one_is_refused(bench, tmp_path):
    for target in bench["targets"].load().values():
        assert target.reason and target.what and target.unit
    bad = tmp_path / "targets.toml"
    bad.write_text('[x]\nwhat = "x"\nunit = "ms"\nreason = "r"\ntarget = { of = "ratio", at_most = 1, at_least = 2 }\n')
    with pytest.raises(ValueError, match="one of at_most and at_least"):
        bench["targets"].load(bad)


def test_the_report_shows_every_row_and_each_missed_target(run, bench):
    text = bench["report"].render(run)
    missed = [row for row in run["rows"] if row["met"] is False]
    assert all(row["what"] in text for row in run["rows"])
    assert text.count("MISSED") == len(missed)
    judged = sum(row["met"] is not None for row in run["rows"])
    assert f"{judged - len(missed)} of {judged} targets met" in text
    markdown = bench["report"].render(run, markdown=True)
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    assert len(lines) == len(run["rows"]) + 2  # a header, its rule and a line per row


def _write(tmp_path: Path, name: str, results: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(results))
    return str(path)


def test_the_gate_passes_the_run_against_the_stored_baseline(bench, capsys):
    assert bench["gate"].main([str(BENCHMARKS / "results.json"), "--baseline", str(BENCHMARKS / "baseline.json")]) == 0
    assert "0 rows worse" in capsys.readouterr().out


def test_the_gate_passes_an_unchanged_run_and_fails_one_row_made_worse(run, bench, tmp_path, capsys):
    gate = bench["gate"]
    baseline = _write(tmp_path, "baseline.json", run)
    assert gate.main([baseline, "--baseline", baseline]) == 0
    allowed = gate.tolerance(run["spread"])
    for row_id, factor, status in (("rpc_sync", 1 + allowed / 2, 0), ("rpc_sync", 1 + allowed + 0.02, 1),
                                   ("throughput", 1 + allowed + 0.02, 1)):
        worse = copy.deepcopy(run)
        row = next(r for r in worse["rows"] if r["id"] == row_id)
        row["ratio"] *= factor  # both ratios read lower-is-better
        capsys.readouterr()
        assert gate.main([_write(tmp_path, "run.json", worse), "--baseline", baseline]) == status, (row_id, factor)
        assert (f"worse than the baseline beyond the spread: {row_id}" in capsys.readouterr().out) == bool(status)


def test_the_gate_reads_a_speed_up_the_other_way(run, bench, tmp_path):
    gate = bench["gate"]
    baseline = _write(tmp_path, "baseline.json", run)
    row = next(r for r in run["rows"] if r["id"] == "user_kernel_tensor")
    assert row["better"] == "higher"
    allowed = gate.tolerance(run["spread"], row.get("spread"))
    for factor, status in ((1.5, 0), (1 / (1 + allowed + 0.05), 1)):
        changed = copy.deepcopy(run)
        next(r for r in changed["rows"] if r["id"] == "user_kernel_tensor")["ratio"] *= factor
        assert gate.main([_write(tmp_path, "run.json", changed), "--baseline", baseline]) == status, factor


def test_the_gate_allows_a_row_its_own_spread_and_judges_values_by_target(run, bench):
    gate = bench["gate"]
    base = {"ratio": 1.0, "spread": 1.2, "better": "lower"}
    assert gate.judge({"ratio": 1.1, "better": "lower"}, base, 0.05)[0] == "same"  # whole runs part by 20%
    assert gate.judge({"ratio": 1.3, "better": "lower"}, base, 0.05)[0] == "worse"
    idle = {"ratio": 0.0, "met": True, "nbrpc": 0.0, "target": "nbrpc <= 1", "better": "lower"}
    assert gate.judge({**idle, "ratio": 0.5, "met": False, "nbrpc": 50.0}, idle, 0.05)[0] == "worse"
    assert gate.judge({**idle, "ratio": 0.01, "met": True, "nbrpc": 0.9}, idle, 0.05)[0] == "same"


def test_a_row_measured_by_its_own_script_is_judged_by_its_target(run, bench, tmp_path):
    gate = bench["gate"]
    baseline = _write(tmp_path, "baseline.json", run)
    for nbrpc, ratio, status in ((0.9, 5.0, 0), (5.0, 5.0, 1)):  # a far worse ratio alone is noise here
        changed = copy.deepcopy(run)
        row = next(r for r in changed["rows"] if r["id"] == "pss_worker")
        assert row["met"] is True and bench["targets"].load()["pss_worker"].gate == "target"
        row.update(nbrpc=row["nbrpc"] * nbrpc, ratio=ratio, met=row["nbrpc"] * nbrpc <= 120)
        assert gate.main([_write(tmp_path, "run.json", changed), "--baseline", baseline]) == status, nbrpc


def test_the_notebook_runs_the_scripts_own_code(bench):
    cells = bench["user"].cells(100, 1)
    assert cells[:2] == ["%load_ext nbrpc", "%rpc_init -n 1"] and cells[-1] == "%rpc_shutdown"
    assert "def echo(value)" in cells[2] and "def measure_all(" in cells[2] and "init_rpc" not in cells[2]
    assert "measure_all(100, 1)" in cells[3]


def test_a_quick_run_of_one_part_writes_its_rows(tmp_path):
    """A smoke test: a quick run completes (status 0, targets met or not) and writes its rows."""
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--only", "definitions,nonesuch"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown part nonesuch" in done.stderr
    done = subprocess.run([sys.executable, str(BENCHMARKS / "run.py"), "--quick", "--only", "recording,handoff",
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [row["id"] for row in results["rows"]] == ["recording", "handoff", "handoff_forced"]
    assert results["complete"] and all(row["ratio"] > 0 for row in results["rows"])
    assert "call recording on" in done.stdout
