"""Errors a student meets, in a real notebook kernel: one line that says what to do."""

from __future__ import annotations

import re

import pytest
from conftest import execute

from nbrpc.errors import RUN_RPC_INIT, not_initialized
from nbrpc.lab import _checking

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_of(kc, code: str) -> dict:
    """The error output of running ``code`` (its ename, evalue, traceback lines)."""
    messages, reply = execute(kc, code)
    assert reply["status"] == "error", reply
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1, messages
    return errors[0]


def one_line(error: dict) -> str:
    lines = [ANSI.sub("", line) for line in error["traceback"]]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("call", [
    "rpc.rpc_sync('worker1', max, args=(1, 2))",
    "rpc.remote('worker1', max, args=(1, 2))",
    "rpc.get_worker_info()",
])
def test_rpc_before_rpc_init_says_run_rpc_init_first(kernel, call):
    _, kc = kernel
    execute(kc, "%load_ext nbrpc\nimport torch.distributed.rpc as rpc")
    error = error_of(kc, call)
    line = one_line(error)
    assert line == f"RuntimeError: {RUN_RPC_INIT}"
    assert "%rpc_init first" in line and "init_rpc" not in line
    # any other error keeps its traceback
    other = error_of(kc, "def f():\n    raise RuntimeError('mine')\nf()")
    assert other["evalue"] == "mine" and len(other["traceback"]) > 1


def test_misused_magics_are_one_line(kernel):
    _, kc = kernel
    execute(kc, "%load_ext nbrpc")
    line = one_line(error_of(kc, "%rpc_timeline --live"))
    assert line.startswith("NoClusterError: no cluster is running") and "%rpc_init" in line
    # IPython prints a UsageError on stderr, alone
    messages, reply = execute(kc, "%rpc_timeline --bogus")
    assert reply["status"] == "error" and not [m for m in messages if m["msg_type"] == "error"]
    printed = ANSI.sub("", "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream"))
    assert printed.strip().count("\n") == 0 and printed.startswith("UsageError: ")
    assert "unrecognized arguments: --bogus" in printed
    line = one_line(error_of(kc, "%rref_graph"))
    assert line.startswith("NoClusterError: ") and "%rpc_init" in line


def test_live_timeline_without_trace_is_one_line(kernel):
    """The cluster records nothing (no --trace): one line saying how to record."""
    _, kc = kernel
    messages, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 1", timeout=180)
    assert reply["status"] == "ok", messages
    try:
        line = one_line(error_of(kc, "%rpc_timeline --live"))
        assert line.startswith("NotRecordingError: this cluster is not recording its calls")
        assert "%rpc_init --trace" in line
    finally:
        _, reply = execute(kc, "%rpc_shutdown", timeout=120)
        assert reply["status"] == "ok"


def test_a_lab_check_says_run_rpc_init_first():
    error = RuntimeError("RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.")
    assert not_initialized(error) and not not_initialized(RuntimeError("anything else"))

    def student_function():
        raise error

    with pytest.raises(_checking._Wrong) as info:
        _checking._call(student_function, what="student_function()")
    message = str(info.value)
    assert "init_rpc first" not in message and "%rpc_init" in message
    # the hint, which check() prints under the message
    hint = next(h for needle, h in _checking._HINTS if re.search(needle, f"RuntimeError: {error}"))
    assert hint.startswith("run the %rpc_init cell")


def test_a_remote_traceback_points_at_the_cell_and_line(kernel):
    """A function defined in a cell fails on a worker: the traceback names the cell and
    line, with the source line, as IPython does for local code (not ``<dynamic-code>``,
    not the cell's temporary file), and nbrpc's own call wrappers are left out."""
    _, kc = kernel
    messages, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 1", timeout=180)
    assert reply["status"] == "ok", messages
    try:
        _, reply = execute(kc, "def scale(x):\n    y = x * 2\n    raise ValueError(f'no {y}')")
        cell = reply["execution_count"]
        error = error_of(kc, "import torch.distributed.rpc as rpc\nrpc.rpc_sync('worker1', scale, args=(3,))")
        text = ANSI.sub("", "\n".join(error["traceback"]))
        assert cell and f"Cell In[{cell}], line 3, in scale\n    raise ValueError(f'no {{y}}')" in text, text
        assert "ipykernel_" not in text and "<dynamic-code>" not in text, text
        assert "nbrpc/calls" not in text and "wrappers.py" not in text, text
        assert error["ename"] == "ValueError" and "On WorkerInfo(id=1, name=worker1)" in error["evalue"]
        # the calling cell's own frame stays, named as IPython names it
        assert re.search(rf"Cell In\[{cell + 1}\], line 2", text), text
        # a remote error that comes home as RuntimeError gets the same treatment
        execute(kc, "def fail():\n    raise RuntimeError('remote boom')")
        error = error_of(kc, "rpc.rpc_sync('worker1', fail)")
        text = ANSI.sub("", "\n".join(error["traceback"]))
        assert f"Cell In[{cell + 2}], line 2, in fail\n    raise RuntimeError('remote boom')" in text, text
        # an error raised here, not remotely, shows as IPython shows it
        local = error_of(kc, "scale(1)")
        text = ANSI.sub("", "\n".join(local["traceback"]))
        assert local["evalue"] == "no 2" and re.search(rf"Cell In\[{cell}\], line 3", text), text
    finally:
        _, reply = execute(kc, "%rpc_shutdown", timeout=120)
        assert reply["status"] == "ok"


@pytest.mark.slow
def test_a_remote_traceback_in_a_worker_cell_points_at_that_workers_cell(kernel):
    """A function defined by ``%%rpc_on worker1`` fails on worker2: the traceback names
    worker1's cell (its execution count there) and line, with the source line."""
    _, kc = kernel
    messages, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 2", timeout=180)
    assert reply["status"] == "ok", messages
    try:
        messages, reply = execute(kc, "%%rpc_on worker1\nimport torch.distributed.rpc as rpc\n"
                                      "def halve(x):\n    raise ValueError(f'odd {x}')\n"
                                      "print('count', len(In) - 1)")
        assert reply["status"] == "ok", messages
        printed = "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")
        count = int(re.search(r"count (\d+)", printed).group(1))
        error = error_of(kc, "%%rpc_on worker1\nrpc.rpc_sync('worker2', halve, args=(3,))")
        text = ANSI.sub("", "\n".join(error["traceback"]))
        assert "worker1" in text and "ValueError" in text, text
        assert f"Cell In[{count}], line 3, in halve\n    raise ValueError(f'odd {{x}}')" in text, text
        assert "ipykernel_" not in text and "nbrpc/calls" not in text, text
    finally:
        _, reply = execute(kc, "%rpc_shutdown", timeout=120)
        assert reply["status"] == "ok"


def test_cell_frames_names_known_cells_and_folds_wrapper_frames():
    from nbrpc.wire.remote_errors import cell_frames

    text = ("On WorkerInfo(id=1, name=worker1):\nTraceback (most recent call last):\n"
            '  File "/site/nbrpc/calls/interrupts.py", line 146, in serve\n'
            "    return self._run(args, kwargs)\n           ^^^^^^^^^^^^^^^^^^^^^^^\n"
            '  File "/tmp/ipykernel_1/42.py", line 3, in scale\n    raise ValueError(y)\n'
            '  File "/usr/lib/python3.11/json/__init__.py", line 7, in loads\n    return x\n'
            "ValueError: 6")
    named = cell_frames({"/tmp/ipykernel_1/42.py": ("Cell", "In[7]")}.get, text)
    assert named == ("On WorkerInfo(id=1, name=worker1):\nTraceback (most recent call last):\n"
                     "  Cell In[7], line 3, in scale\n    raise ValueError(y)\n"
                     '  File "/usr/lib/python3.11/json/__init__.py", line 7, in loads\n    return x\n'
                     "ValueError: 6")
