"""The benchmarks' results file, its report and the regression gate, on real result files
(``benchmarks/results.json``, the last run, and ``benchmarks/baseline.json``, the last
accepted one, come from real runs)."""

from __future__ import annotations

import copy
import importlib
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ROW_KEYS = {"id", "what", "unit", "nbrpc", "reference", "reference_name", "ratio", "target", "met", "reason"}
TOP_KEYS = {"machine", "torch", "nbrpc", "date", "spread", "rows"}


@pytest.fixture(scope="module")
def bench():
    """The benchmark modules, imported as ``run.py`` imports them (from their folder)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name)
               for name in ("results", "report", "gate", "targets", "user", "phases")}
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


STORED_BASELINE = str(BENCHMARKS / "baseline.json")


def test_the_stored_baseline_is_an_accepted_full_run_the_run_is_it_or_newer(run, bench):
    baseline = bench["results"].read(STORED_BASELINE)
    assert baseline["complete"] and not baseline["quick"], "the baseline is a full run"
    assert baseline["accepted"]["why"].strip() and baseline["accepted"]["date"] >= baseline["date"]
    assert run["date"] >= baseline["date"], "results.json is the last run: the accepted one or a newer one"


def test_the_gate_judges_the_stored_run_against_the_stored_baseline(run, bench, capsys):
    """A newer run that got worse fails here until a change accepts it (``gate.py --accept``)."""
    assert bench["gate"].main([str(BENCHMARKS / "results.json"), "--baseline", STORED_BASELINE]) == 0
    out = capsys.readouterr().out
    assert "0 rows worse" in out
    itself = run["date"] == bench["results"].read(STORED_BASELINE)["date"]
    assert ("the run is the baseline itself" in out) == itself


def test_the_gate_fails_a_run_made_worse_than_the_stored_baseline_beyond_the_spread(bench, tmp_path, capsys):
    gate = bench["gate"]
    baseline = bench["results"].read(STORED_BASELINE)
    allowed = gate.tolerance(baseline["spread"])
    assert 0 < allowed < 0.5, "the stored run measured its spread"
    for row_id, factor, status in (("rpc_sync", 1 + allowed / 2, 0), ("rpc_sync", 1 + allowed + 0.02, 1),
                                   ("throughput", 1 + allowed / 2, 0), ("throughput", 1 + allowed + 0.02, 1)):
        worse = copy.deepcopy(baseline)
        worse["date"] = "2099-01-01T00:00:00+00:00"  # a later run, not the baseline itself
        row = next(r for r in worse["rows"] if r["id"] == row_id)
        assert "spread" not in row, row_id  # judged by the run's spread alone
        row["ratio"] *= factor  # both ratios read lower-is-better
        capsys.readouterr()
        assert gate.main([_write(tmp_path, "run.json", worse), "--baseline", STORED_BASELINE]) == status, \
            (row_id, factor)
        out = capsys.readouterr().out
        assert (f"worse than the baseline beyond the spread: {row_id}" in out) == bool(status)
        assert "the run is the baseline itself" not in out


def test_accepting_a_run_makes_it_the_baseline_with_its_reason(run, bench, tmp_path, capsys):
    gate, path = bench["gate"], tmp_path / "baseline.json"
    newer = copy.deepcopy(run)
    newer["date"] = "2099-01-01T00:00:00+00:00"
    next(r for r in newer["rows"] if r["id"] == "rpc_sync")["ratio"] *= 1.5
    newer_file = _write(tmp_path, "run.json", newer)
    assert gate.main([newer_file, "--baseline", STORED_BASELINE]) == 1
    with pytest.raises(SystemExit, match="needs the reason"):
        gate.main([newer_file, "--baseline", str(path), "--accept", " "])
    with pytest.raises(SystemExit, match="complete, full run"):
        gate.main([_write(tmp_path, "quick.json", {**newer, "quick": True}), "--baseline", str(path), "--accept", "x"])
    assert not path.exists()
    assert gate.main([newer_file, "--baseline", str(path), "--accept", "a slower pickler, for fidelity"]) == 0
    accepted = bench["results"].read(path)
    assert accepted["accepted"]["why"] == "a slower pickler, for fidelity" and accepted["rows"] == newer["rows"]
    assert gate.main([newer_file, "--baseline", str(path)]) == 0  # the new level, no longer worse


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_every_part_of_the_call_path_can_be_left_out_of_every_loop():
    """``make bench-parts`` in brief: each loop runs with each part left out (the stand-ins
    keep the calls working: a remote's fetch with the calls in flight left out too) and
    its table names every part with a figure."""
    from nbrpc import _bench

    done = subprocess.run([sys.executable, str(BENCHMARKS / "parts.py"), "--rounds", "1", "--calls", "4"],
                          capture_output=True, text=True, timeout=300, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    loops = 8
    assert sum("per call (us)" in line for line in lines) == loops, done.stdout  # one table a loop
    for part in _bench.PARTS:
        assert sum(part in line and line.endswith("% of the wall") for line in lines) == loops, (part, done.stdout)


@pytest.mark.slow
def test_a_calls_phases_split_it_on_both_sides_for_each_kind_of_argument(bench):
    """``make bench-parts``'s phases in brief: nbrpc's side gives every phase of an
    ``rpc_sync`` for each kind of argument outside an autograd context, the phases of
    every call adding up to the whole call, and the table puts them beside another side's."""
    phases = bench["phases"]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "phases.py"), "--side", "nbrpc", "--rounds", "1",
                           "--calls", "3"], capture_output=True, text=True, timeout=300, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert list(found) == ["int", "tensor", "tensor64k", "dict", "kwargs", "instance"]
    for kind, by_phase in found.items():
        assert list(by_phase) == list(phases.PHASES)
        assert all(len(values) == 3 for values in by_phase.values()), (kind, by_phase)
        parts = [sum(call) for call in zip(*(by_phase[p] for p in phases.PHASES[:-1]))]
        assert parts == pytest.approx(by_phase["whole call"], abs=0.01), kind
        assert all(value > 0 for p in ("driver pickles", "worker pickles") for value in by_phase[p]), kind
    lines = phases.table({"nbrpc": found, "raw": found}).splitlines()
    assert [line.split("  ")[0] for line in lines[1:-1]] == list(phases.PHASES)
    assert lines[-1].split()[1:] == ["1.000"] * len(found)  # the whole call's ratio, a side against itself


def _runs(values: list[float]) -> list[dict]:
    return [{"sync_ms": v, "remote_ms": v, "throughput": 1 / v, "tensor_ms": v} for v in values]


def test_the_users_rows_pair_each_run_with_the_reference_run_of_its_turn(bench):
    """A row's ratio is the median of the turns' ratios, which the machine's drift between
    turns leaves alone; the ratio of the medians is in the note."""
    reference = [3.0, 1.0, 2.0, 5.0, 4.0]  # the machine's speed drifting from turn to turn
    ours = [r * f for r, f in zip(reference, (1.01, 1.02, 1.03, 1.04, 1.5))]
    found = {"kernel": _runs(ours), "script": _runs(reference), "raw": _runs(reference), "raw_uv": _runs(reference)}
    rows = {row["id"]: row for row in bench["user"].user_rows(found)}
    sync = rows["user_kernel_sync_uv"]
    assert sync["ratio"] == pytest.approx(1.03) and "of the medians: 1.010" in sync["note"]
    assert sync["met"] is True and sync["nbrpc"] == pytest.approx(3.03) and sync["reference"] == 3.0
    assert rows["user_kernel_throughput_uv"]["ratio"] == pytest.approx(1.03)  # calls/s: reference/nbrpc
    assert rows["user_script_sync_uv"]["ratio"] == 1.0
    assert "user_kernel_tensor" in rows and "user_kernel_tensor_uv" not in rows


def test_the_side_by_side_rows_take_each_turns_ratio(bench):
    def turn(sync_ms, remote_ms, throughput):
        return {"sync_ms": sync_ms, "remote_ms": remote_ms, "throughput": throughput}

    turns = {"kernel": [turn(1.1, 2.0, 900), turn(2.2, 1.0, 1800)],
             "script": [turn(1.0, 2.0, 1000), turn(2.0, 1.0, 2000)],
             "raw_uv": [turn(1.0, 1.0, 1000), turn(2.0, 1.0, 2000)]}
    rows = {row["id"]: row for row in bench["user"].beside_rows({"turns": turns, "calls": 200})}
    assert set(rows) == set(bench["user"].BESIDE_ROWS)
    assert rows["user_kernel_beside_script_sync"]["ratio"] == pytest.approx(1.1)
    assert rows["user_kernel_beside_raw_sync"]["ratio"] == pytest.approx(1.1)
    remote = rows["user_kernel_beside_raw_remote"]
    assert remote["ratio"] == pytest.approx(1.5) and remote["met"] is False and "100 calls a turn" in remote["note"]
    rate = rows["user_kernel_beside_raw_throughput"]  # a rate: the reference's over nbrpc's
    assert rate["ratio"] == pytest.approx(1000 / 900, rel=1e-5) and rate["met"] is False
    assert "200 calls a turn" in rate["note"]
    assert rows["user_script_beside_raw_throughput"]["ratio"] == pytest.approx(1.0)


def test_the_argument_kind_table_has_a_row_for_each_form_kind_and_side(bench):
    """Each form of call with each kind of argument, from the kernel, the script and the
    controls (a second init_rpc pair, a plain kernel under init_rpc), against the init_rpc
    pair of the same turn; a row's ratio is the median of the turns' ratios; the controls'
    rows have no target."""
    user = bench["user"]
    figures = [f"{form}_{kind}" for form in user.FORMS for kind in user.ARGUMENT_KINDS]
    assert len(figures) == 28 and "remote_tensor" in figures and "proxy_instance" in figures
    kinds = {"raw_uv": [dict.fromkeys(figures, 1.0), dict.fromkeys(figures, 2.0), dict.fromkeys(figures, 4.0)],
             "script": [dict.fromkeys(figures, 1.0), dict.fromkeys(figures, 2.0), dict.fromkeys(figures, 4.0)]}
    kinds["kernel"] = [{name: turn[name] * factor for name in figures}
                       for turn, factor in zip(kinds["raw_uv"], (1.02, 1.2, 1.04))]
    kinds["raw_uv_again"] = [{name: turn[name] * factor for name in figures}
                             for turn, factor in zip(kinds["raw_uv"], (0.9, 1.06, 1.07))]
    kinds["raw_kernel"] = [{name: turn[name] * factor for name in figures}
                           for turn, factor in zip(kinds["raw_uv"], (1.1, 1.08, 0.95))]
    assert set(kinds) == set(user.KIND_SIDES)
    rows = {row["id"]: row for row in user.kind_rows({"kinds": kinds, "kind_calls": 15})}
    assert len(rows) == 112 and set(rows) <= set(bench["targets"].load())
    grad = rows["user_kernel_beside_raw_remote_grad"]
    assert grad["ratio"] == pytest.approx(1.04) and grad["met"] is True and "15 calls a turn" in grad["note"]
    assert rows["user_script_beside_raw_proxy_dict"]["ratio"] == 1.0
    control = rows["user_control_beside_raw_sync_instance"]
    assert control["ratio"] == pytest.approx(1.06) and control["met"] is None
    plain = rows["user_plainkernel_beside_raw_remote_int"]
    assert plain["ratio"] == pytest.approx(1.08) and plain["met"] is None


def _side_by_side_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if "user_script.py" in line or "nbrpc-user-" in line:
            found.append(proc)
    return found


@pytest.mark.slow
def test_a_kernel_a_script_and_the_init_rpc_pair_run_side_by_side(bench):
    """Real processes: a Jupyter kernel with nbrpc, a script with nbrpc and an init_rpc pair
    take turns, of small calls and of the argument-kind table (with the controls: another
    init_rpc pair, a plain kernel under init_rpc); every process they started is gone after."""
    found = bench["user"].side_by_side(turns=2, calls=20, kind_turns=1, kind_calls=2)
    assert {side: len(turns) for side, turns in found["turns"].items()} == {"kernel": 2, "script": 2, "raw_uv": 2}
    assert set(found["kinds"]) == {"kernel", "script", "raw_uv", "raw_uv_again", "raw_kernel"}  # with the controls
    for [kinds] in found["kinds"].values():  # every form with every kind of argument ran, on every side
        assert len(kinds) == 28 and all(0.01 < ms < 1000 for ms in kinds.values()), kinds
    assert all(row["ratio"] > 0 for row in bench["user"].kind_rows(found))
    for turns in found["turns"].values():
        assert all(0.01 < turn["sync_ms"] < 100 and 0.01 < turn["remote_ms"] < 100 and 10 < turn["throughput"] < 1e6
                   for turn in turns), turns
    assert all(row["ratio"] > 0 for row in bench["user"].beside_rows(found))
    assert not _side_by_side_processes()


def _bytecodes(*flags: str) -> dict[str, int]:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bytecodes.py"), "--calls", "20", "--loops", "rpc_sync",
                           "--top", "3", *flags], capture_output=True, text=True, timeout=240, cwd=BENCHMARKS)
    assert done.returncode == 0, done.stderr[-3000:]
    first, *rest = done.stdout.strip().split("costliest functions:")[0].splitlines()
    where = ", on the worker" if "--worker" in flags else ""
    assert first.startswith(f"rpc_sync{where}: ") and first.endswith(" bytecodes a call"), first
    modules = {}
    for line in filter(str.strip, rest):
        count, module = line.split()
        modules[module] = int(count)
    return {"total": int(first.rpartition(": ")[2].split()[0].replace(",", "")), **modules}


@pytest.mark.slow
def test_bytecodes_counts_a_calls_work_on_the_drivers_main_thread_by_module():
    """bytecodes.py counts what a call runs (nbrpc's modules by name, torch's as one); raw
    torch runs none of nbrpc's."""
    nbrpc_side, raw = _bytecodes(), _bytecodes("--raw")
    by_module = [count for module, count in nbrpc_side.items() if module != "total"]
    assert abs(sum(by_module) - nbrpc_side["total"]) <= len(by_module)  # (each rounded)
    assert {"nbrpc/calls/wrappers", "nbrpc/recording/pending", "torch"} <= set(nbrpc_side)
    assert not any(module.startswith("nbrpc/") for module in raw) and raw["torch"] > 100
    assert raw["total"] < nbrpc_side["total"] < 10 * raw["total"]


@pytest.mark.slow
def test_bytecodes_counts_what_the_workers_threads_run_for_the_calls_they_serve():
    """--worker counts on the worker's serving threads: the call served (the function
    itself among "other") and its reply pickled, none of the driver's wrappers."""
    worker = _bytecodes("--worker")
    assert {"nbrpc/calls/serving", "nbrpc/calls/interrupts", "nbrpc/wire/serialization"} <= set(worker)
    assert "nbrpc/calls/wrappers" not in worker and worker["other"] < 40, worker
    assert 100 < worker["total"] < 5000
