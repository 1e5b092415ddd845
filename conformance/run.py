"""Run torch's RPC test suites raw and with nbrpc's patches, and print the differences.

    python conformance/run.py [--suites NAME,...] [-k EXPR] [--timeout S] [--jobs N] [--xdist N] [--deadline S]
                              [--repeat N] [--flaky-prone]

Each (mode, suite) is one pytest run of ``suites.py`` in its own process group, its
results in ``build/conformance/MODE/SUITE.xml``. A test that runs past ``--timeout``
(torch's ``MultiProcessTestCase`` ends its ranks then) is reported as ``timeout``;
a whole run is ended after its tests' share of time. ``--report`` prints the table from
results already there. Differences listed in ``DIFFERENCES.md`` (``- `Suite.test`: why``)
count as documented.

``--repeat N`` runs each (mode, suite) N times in a row (results in ``SUITE.rI.xml``); a
test's outcome is then the same in every run, or ``failed K/N`` where it failed K of
them. ``--flaky-prone`` runs only ``FLAKY_PRONE``, the tests that failed now and then
with nbrpc's patches once, 20 times each unless ``--repeat`` says otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "build" / "conformance"
MODES = ("raw", "nbrpc")
DOCUMENTED = HERE / "DIFFERENCES.md"
# Suite -> tests that failed now and then with nbrpc's patches (issue 55: a fetch sent
# twice left RRefs forked, and the graceful shutdown waited on them); run many times in a row.
FLAKY_PRONE = {"TensorPipeRpcTest": ["test_nested_rref_stress"],
               "TensorPipeTensorPipeAgentRpcTest": ["test_nested_rref_stress_sparse"]}
FLAKY_PRONE_RUNS = 20


def suite_tests() -> dict[str, list[str]]:
    """Suite class name (as generated) -> its test names; CUDA suites marked by name."""
    sys.path.insert(0, str(ROOT))
    os.environ["NBRPC_CONFORMANCE"] = "raw"  # the runner itself stays raw; each run sets its mode
    from conformance import suites

    loader = unittest.TestLoader()
    return {suites.PREFIX + c.__name__: list(loader.getTestCaseNames(getattr(suites, suites.PREFIX + c.__name__)))
            for c in suites.CPU_SUITES + suites.CUDA_SUITES}


def cuda_suites() -> set[str]:
    from conformance import suites

    return {suites.PREFIX + c.__name__ for c in suites.CUDA_SUITES}


def run_repeated(mode: str, suite: str, count: int, key: str, timeout: int, select: str | None,
                 xdist: int = 0, until: float | None = None, repeat: int = 1) -> float:
    """``run_suite`` ``repeat`` times in a row (once: its usual results file); returns the wall time."""
    for old in (OUT / mode).glob(f"{suite}.r*.xml"):
        old.unlink()
    if repeat <= 1:
        return run_suite(mode, suite, count, key, timeout, select, xdist, until)
    return sum(run_suite(mode, suite, count, key, timeout, select, xdist, until, tag=f".r{i + 1}")
               for i in range(repeat))


def run_suite(mode: str, suite: str, count: int, key: str, timeout: int, select: str | None,
              xdist: int = 0, until: float | None = None, tag: str = "") -> float:
    """One pytest run of ``suite`` in ``mode`` (its tests spread over up to ``xdist``
    pytest-xdist workers when given, stopped at the monotonic time ``until`` if given),
    its results in ``SUITE{tag}.xml``; returns its wall time."""
    out = OUT / mode
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NBRPC_CONFORMANCE=mode, NBRPC_CONFORMANCE_KEY=key,
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "pytest", "-c", str(HERE / "pytest.ini"), f"{HERE / 'suites.py'}::{suite}",
           "-q", "-p", "no:warnings", *(["-k", select] if select else []), f"--junitxml={out / suite}{tag}.xml",
           "-o", "junit_logging=no", "-o", "junit_duration_report=call",
           *(["-n", str(min(xdist, count))] if xdist > 1 and count > 1 else [])]
    began = time.monotonic()
    with open(out / f"{suite}{tag}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        budget = count * (timeout + 30) / max(1, min(xdist, count)) + 120
        if until is not None:
            budget = max(1.0, min(budget, until - time.monotonic()))
        try:
            proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            # Interrupted, pytest still writes the results of the tests that ended.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            log.write(f"\nconformance: run ended after {time.monotonic() - began:.0f} s\n")
        finally:
            if proc.poll() is None or _group_alive(proc.pid):
                _end_group(proc)
    return time.monotonic() - began


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _end_group(proc: subprocess.Popen) -> None:
    """End the run's process group (pytest and the ranks it spawned): gently, then for good."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            proc.poll()
            time.sleep(0.1)
    proc.poll()


def outcomes(mode: str, suite: str, timeout: int) -> dict[str, str]:
    """Test name -> passed, failed, skipped or timeout, from a run's junit XML; after
    repeated runs, the outcome all of them had, or ``failed K/N``."""
    repeats = sorted((OUT / mode).glob(f"{suite}.r*.xml"))
    if not repeats:
        return _outcomes_in(OUT / mode / f"{suite}.xml", timeout)
    runs = [_outcomes_in(path, timeout) for path in repeats]
    found = {}
    for name in {n for run in runs for n in run}:
        each = [run.get(name, "not run") for run in runs]
        bad = sum(o not in ("passed", "skipped") for o in each)
        found[name] = each[0] if len(set(each)) == 1 else f"failed {bad}/{len(each)}"
    return found


def _outcomes_in(path: Path, timeout: int) -> dict[str, str]:
    if not path.exists():
        return {}
    found = {}
    for case in ET.parse(path).iter("testcase"):
        if case.find("skipped") is not None:
            found[case.get("name")] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            slow = float(case.get("time", 0)) >= timeout - 1
            found[case.get("name")] = "timeout" if slow else "failed"
        else:
            found[case.get("name")] = "passed"
    return found


def documented() -> dict[str, str]:
    """``Suite.test`` -> why, from DIFFERENCES.md."""
    if not DOCUMENTED.exists():
        return {}
    return dict(re.findall(r"^- `([\w.]+)`: (.+)$", DOCUMENTED.read_text(), flags=re.M))


def report(tests: dict[str, list[str]], timeout: int, skipped_cuda: set[str]) -> int:
    """Print the table and the differing tests; returns how many differences are undocumented
    (a suite not run both ways counts as one)."""
    known = documented()
    rows, listed, undocumented = [], [], 0
    for suite, names in tests.items():
        if suite in skipped_cuda:
            rows.append((suite, len(names), "-", "-", "skipped: no CUDA"))
            continue
        raw, ours = outcomes("raw", suite, timeout), outcomes("nbrpc", suite, timeout)
        if not raw or not ours:
            rows.append((suite, len(names), len(raw) and sum(v == "passed" for v in raw.values()) or "-",
                         len(ours) and sum(v == "passed" for v in ours.values()) or "-", "not run both ways"))
            undocumented += 1  # a run cut short does not pass
            continue
        differ = [n for n in names if raw.get(n, "not run") != ours.get(n, "not run")]
        docs = [n for n in differ if f"{suite}.{n}" in known]
        undocumented += len(differ) - len(docs)
        passed = (sum(v == "passed" for v in raw.values()), sum(v == "passed" for v in ours.values()))
        rows.append((suite, len(names), passed[0], passed[1], f"{len(differ) - len(docs)} (+{len(docs)} documented)"))
        for n in differ:
            why = known.get(f"{suite}.{n}")
            listed.append(f"  {suite}.{n}: raw {raw.get(n, 'not run')}, nbrpc {ours.get(n, 'not run')}"
                          + (f" [documented: {why}]" if why else ""))
    head = ("suite", "tests", "raw passed", "nbrpc passed", "differences")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    if listed:
        print("\ndiffering tests:")
        print("\n".join(listed))
    return undocumented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", help="comma-separated suite names (default: all)")
    parser.add_argument("-k", dest="select", help="pytest -k expression within each suite")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test before its ranks are ended")
    parser.add_argument("--jobs", type=int, default=2, help="pytest runs at once")
    parser.add_argument("--xdist", type=int, default=0,
                        help="pytest-xdist workers per run (needs pytest-xdist; each test's ranks are its own)")
    parser.add_argument("--modes", default=",".join(MODES), help="modes to run (raw, nbrpc)")
    parser.add_argument("--deadline", type=float, help="seconds after which every run still going is "
                        "interrupted (its finished tests are reported)")
    parser.add_argument("--report", action="store_true", help="only print the table of results already there")
    parser.add_argument("--repeat", type=int, help="runs of each suite in a row (a test passes if it passes in all)")
    parser.add_argument("--flaky-prone", action="store_true",
                        help=f"only the tests in FLAKY_PRONE, {FLAKY_PRONE_RUNS} runs in a row unless --repeat")
    args = parser.parse_args(argv)
    tests = suite_tests()
    if args.flaky_prone:
        if args.suites or args.select:
            parser.error("--flaky-prone chooses its own suites and tests: leave out --suites and -k")
        tests = {s: [n for n in tests[s] if n in FLAKY_PRONE[s]] for s in FLAKY_PRONE}
        args.repeat = args.repeat or FLAKY_PRONE_RUNS
    chosen = args.suites.split(",") if args.suites else list(tests)
    unknown = set(chosen) - set(tests)
    if unknown:
        parser.error(f"no suite {', '.join(sorted(unknown))}; the suites are {', '.join(tests)}")
    tests = {s: tests[s] for s in chosen}
    import torch

    skipped_cuda = set() if torch.cuda.is_available() else cuda_suites() & set(tests)
    if not args.report:
        key = secrets.token_hex(32)
        began = time.monotonic()
        until = began + args.deadline if args.deadline else None
        # Small suites first: a run cut short still covers every suite but the biggest.
        order = sorted((s for s in tests if s not in skipped_cuda), key=lambda s: len(tests[s]))
        jobs = [(mode, s) for s in order for mode in args.modes.split(",")]
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            walls = pool.map(lambda job: (job, run_repeated(
                *job, len(tests[job[1]]), key, args.timeout, _selection(args, job[1]), args.xdist, until,
                args.repeat or 1)), jobs)
            for (mode, suite), wall in walls:
                print(f"{mode:6} {suite}: {wall:.0f} s", flush=True)
        print(f"total {time.monotonic() - began:.0f} s with {args.jobs} runs at once\n")
    return 1 if report(tests, args.timeout, skipped_cuda) else 0


def _selection(args, suite: str) -> str | None:
    """The pytest -k expression of ``suite``'s run: the flaky-prone tests by exact name."""
    if not args.flaky_prone:
        return args.select
    return " or ".join(f"{name} and not {name}_" for name in FLAKY_PRONE[suite])


if __name__ == "__main__":
    sys.exit(main())
