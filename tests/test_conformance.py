"""A subset of torch's own RPC tests, run with nbrpc's patches in every rank.

``conformance/run.py`` runs torch's whole suites raw and patched side by side; this
picks one test for each path nbrpc patches (calls, RRefs and their helpers,
``@async_execution``, futures, remote exceptions, timeouts, distributed autograd,
``DistributedOptimizer``, dynamic membership) and asserts each passes. torch's
``MultiProcessTestCase`` starts and ends the ranks, here from a forkserver that imported
torch, its test modules and nbrpc's patches once (``conformance/suites.py``; the full
suites spawn them, as torch does), on uv, the transport nbrpc's members join on (shm's
pollers spin a core per rank); ``TIMEOUT`` bounds each test.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 150  # seconds per torch test before its ranks are ended (one took 77 s on a loaded machine)

SUBSET = {
    "TensorPipeRpcTest": [
        "test_py_user_defined",  # rpc_sync of a Python function
        "test_nested_rpc",  # rpc_sync from inside an RPC
        "test_wait_all",  # rpc_async futures gathered by torch's _wait_all
        "test_wait_all_exit_early_python",  # torch.futures.wait_all raises the first failure at once
        "test_callback_chain",  # futures and then() callbacks
        "test_py_rref_args_user_share",  # remote, RRefs forked as arguments
        "test_rref_proxy_tensor",  # RRef helpers: rref.rpc_sync(), rpc_async(), remote()
        "test_async_function_chained_remote",  # @async_execution
        "test_py_raise_in_user_func",  # a remote exception
        "test_rpc_timeouts",  # timeouts, matched by torch's message
        "test_send_to_rank",  # an unknown destination raises torch's RuntimeError
        "test_use_rref_after_shutdown",  # to_here after shutdown: torch's own error
    ],
    "TensorPipeDistAutogradTest": [
        "test_graph_for_py_nested_remote_call",  # the send and recv functions of a context
        "test_backward_simple_python_udf",  # backward through remote().to_here()
    ],
    "TensorPipeDistOptimizerTest": ["test_dist_optim"],
    "TensorPipeTensorPipeAgentRpcTest": ["test_dynamic_rpc_new_rank_can_communicated_with_existing_rank"],
}


def outcomes(junit: Path) -> dict[str, str]:
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        found[f"{case.get('classname').rsplit('.', 1)[-1]}.{case.get('name')}"] = (
            "skipped" if skipped is not None else f"failed: {failed.get('message', '')[:300]}"
            if failed is not None else "passed")
    return found


@pytest.mark.slow
@pytest.mark.timeout(sum(map(len, SUBSET.values())) * (TIMEOUT + 30) + 120)
def test_torchs_rpc_tests_pass_with_nbrpcs_patches(tmp_path):
    junit = tmp_path / "subset.xml"
    env = dict(os.environ, NBRPC_CONFORMANCE="nbrpc", NBRPC_CONFORMANCE_KEY=secrets.token_hex(32),
               NBRPC_CONFORMANCE_START="forkserver", NBRPC_CONFORMANCE_TRANSPORTS="uv",
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(TIMEOUT),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    ids = [f"conformance/suites.py::{suite}::{test}" for suite, tests in SUBSET.items() for test in tests]
    cmd = [sys.executable, "-m", "pytest", "-c", "conformance/pytest.ini", "-q", "-p", "no:warnings",
           f"--junitxml={junit}", *ids]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=len(ids) * (TIMEOUT + 30) + 60)
    finally:
        if proc.poll() is None:  # the runner and the ranks it spawned
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    found = outcomes(junit)
    expected = {f"{suite}.{test}" for suite, tests in SUBSET.items() for test in tests}
    assert set(found) == expected, output[-3000:]
    failed = {name: outcome for name, outcome in found.items() if outcome != "passed"}
    assert not failed, f"{failed}\n{output[-3000:]}"


def test_repeated_runs_report_a_test_that_failed_in_some_of_them(tmp_path, monkeypatch):
    """``run.py --repeat``: a test's outcome is the one it had in every run, or ``failed K/N``."""
    sys.path.insert(0, str(ROOT))
    from conformance import run

    monkeypatch.setattr(run, "OUT", tmp_path)
    (tmp_path / "nbrpc").mkdir()
    case = '<testcase classname="S" name="{}" time="1.0">{}</testcase>'
    for i, failed in enumerate([False, True, False], start=1):
        cases = case.format("test_a", "<failure/>" if failed else "") + case.format("test_b", "")
        (tmp_path / "nbrpc" / f"S.r{i}.xml").write_text(f"<testsuite>{cases}</testsuite>")
    assert run.outcomes("nbrpc", "S", timeout=180) == {"test_a": "failed 1/3", "test_b": "passed"}
    (tmp_path / "nbrpc" / "T.xml").write_text(f"<testsuite>{case.format('test_a', '<failure/>')}</testsuite>")
    assert run.outcomes("nbrpc", "T", timeout=180) == {"test_a": "failed"}  # a single run's file
