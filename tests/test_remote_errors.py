"""Error texts and tracebacks a user sees carry the user's frames, never nbrpc's: a remote
error's text keeps torch's shape (``On WorkerInfo(...)``, the error, the traceback of the
user's frames), a chain of remote errors across members folds into one traceback, root
cause first, and a timeout of a lock chain is told once, in one message.

In a real kernel (the cell's error output is what a user reads: ``evalue`` is
``str(e)``, ``traceback`` the lines shown), and without a kernel for the text's parts.
"""

from __future__ import annotations

import re
import traceback

import pytest
from conftest import execute

from nbrpc._util import Hooks
from nbrpc.wire import remote_errors

ANSI = re.compile(r"\x1b\[[0-9;]*m")

FUNCTIONS = """\
import threading, traceback
import torch.distributed.rpc as rpc
def bad(x):
    y = x * 2
    raise ValueError(f"bad {y}")
def hop(x):
    return rpc.rpc_sync("worker2", bad, args=(x,))
lock = threading.Lock()
def h():
    with lock:
        return 1
def g():
    return rpc.rpc_sync("worker1", h)
def f():
    with lock:
        return rpc.rpc_sync("worker2", g)
"""


def error_of(kc, code: str, timeout: float = 120) -> dict:
    messages, reply = execute(kc, code, timeout=timeout)
    assert reply["status"] == "error", reply
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1, messages
    return errors[0]


def printed(kc, code: str) -> str:
    messages, reply = execute(kc, code)
    assert reply["status"] == "ok", messages
    return "".join(m["content"]["text"] for m in messages
                   if m["msg_type"] == "stream" and m["content"]["name"] == "stdout")


def no_nbrpc_frames(text: str) -> None:
    assert "nbrpc/" not in text and "nbrpc\\" not in text, text
    assert "\nAt:\n" not in text, text  # the C++ stack torch's callbacks add


@pytest.mark.slow
def test_remote_errors_carry_the_users_frames_and_never_nbrpcs(kernel):
    _, kc = kernel
    _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 2 --timeout 4", timeout=180)
    assert reply["status"] == "ok", reply
    try:
        _, reply = execute(kc, FUNCTIONS)
        cell = reply["execution_count"]
        assert reply["status"] == "ok", reply

        # One member: torch's shape, the user's frame, named by its cell in the display.
        error = error_of(kc, "rpc.rpc_sync('worker1', bad, args=(3,))")
        assert error["ename"] == "ValueError"
        assert re.search(r"On WorkerInfo\(id=\d+, name=worker1\):\nValueError\('bad 6'\)\n"
                         r"Traceback \(most recent call last\):\n  File \"[^\"]+\", line 5, in bad\n", error["evalue"])
        assert error["evalue"].rstrip().endswith("ValueError: bad 6"), error["evalue"]
        no_nbrpc_frames(error["evalue"])
        shown = ANSI.sub("", "\n".join(error["traceback"]))
        assert f"Cell In[{cell}], line 5, in bad" in shown and f"Cell In[{cell + 1}], line 1" in shown, shown
        no_nbrpc_frames(shown)

        # master -> worker1 (hop) -> worker2 (bad): one traceback, root cause first.
        error = error_of(kc, "rpc.rpc_sync('worker1', hop, args=(3,))")
        text = error["evalue"]
        assert error["ename"] == "ValueError"
        assert re.match(r"(ValueError: )?On WorkerInfo\(id=\d+, name=worker2\):\nValueError\('bad 6'\)\n", text), text
        assert text.count("Traceback (most recent call last)") == 1, text
        one = re.search(r"  On WorkerInfo\(id=\d+, name=worker1\):\n  File \"[^\"]+\", line 7, in hop\n(?:.*\n)*?"
                        r"  On WorkerInfo\(id=\d+, name=worker2\):\n  File \"[^\"]+\", line 5, in bad\n", text)
        assert one, text
        assert text.count("bad 6") == 2, text  # the error's repr and its last line, once each
        no_nbrpc_frames(text)
        shown = ANSI.sub("", "\n".join(error["traceback"]))
        assert f"Cell In[{cell}], line 7, in hop" in shown and f"Cell In[{cell}], line 5, in bad" in shown, shown
        no_nbrpc_frames(shown)

        # What print(e) and the traceback module write, in the user's own code.
        out = printed(kc, "try:\n    rpc.rpc_sync('worker1', hop, args=(3,))\nexcept ValueError as e:\n"
                          "    print(e)\n    print(''.join(traceback.format_exception_only(e)))")
        assert "line 7, in hop" in out and "line 5, in bad" in out, out
        no_nbrpc_frames(out)

        # The three-member lock chain times out: told once, in one message.
        error = error_of(kc, "rpc.rpc_sync('worker1', f)", timeout=60)
        assert error["ename"] == "RpcTimeoutError"
        text = error["evalue"]
        assert text.startswith("rpc_sync('worker1', f) got no answer within 4 s ("), text
        assert "Traceback" not in text and "On WorkerInfo(" not in text, text
        no_nbrpc_frames(text)
        shown = ANSI.sub("", "\n".join(error["traceback"]))
        assert f"Cell In[{cell + 4}], line 1" in shown, shown
        no_nbrpc_frames(shown)
    finally:
        execute(kc, "%rpc_shutdown", timeout=60)


WORKER1 = "WorkerInfo(id=1, name=worker1)"
WORKER2 = "WorkerInfo(id=2, name=worker2)"


def _raise(error: BaseException):
    raise error


def test_a_remote_errors_text_leaves_out_nbrpcs_frames():
    hooks = Hooks()  # a frame of nbrpc's between this one and the user's function
    hooks.add(lambda: _raise(ValueError("bad 6")))
    try:
        hooks.first()
    except ValueError as e:
        assert any(frame.filename.endswith("_util.py") for frame in traceback.extract_tb(e.__traceback__))
        text = remote_errors.remote_text(e, WORKER1)
    assert text.startswith(f"On {WORKER1}:\nValueError('bad 6')\nTraceback (most recent call last):\n")
    assert ", in _raise\n" in text and ", in <lambda>\n" in text and text.endswith("ValueError: bad 6\n")
    no_nbrpc_frames(text)


def test_a_nested_remote_error_folds_into_one_chain_root_cause_first():
    inner = (f"ValueError: On {WORKER2}:\nValueError('bad 6')\nTraceback (most recent call last):\n"
             '  File "/site/nbrpc/calls/interrupts.py", line 158, in serve\n    return _run(func)\n'
             '  File "/home/u/job.py", line 5, in bad\n    raise ValueError(f"bad {y}")\n'
             "ValueError: bad 6\n\nAt:\n  /site/torch/distributed/rpc/internal.py(236): _handle_exception\n"
             "  /site/nbrpc/wire/remote_errors.py(47): _handle_exception\n")
    try:
        _raise(ValueError(inner))
    except ValueError as e:
        text = remote_errors.remote_text(e, WORKER1)
    assert text.startswith(f"On {WORKER2}:\nValueError('bad 6')\nTraceback (most recent call last):\n"
                           f"  On {WORKER1}:\n"), text
    assert text.index(", in _raise") < text.index(f"  On {WORKER2}:\n") < text.index("line 5, in bad")
    assert text.endswith("ValueError: bad 6") and text.count("Traceback") == 1, text
    no_nbrpc_frames(text)
    # A third member folds in the same way: its frames above the rest.
    try:
        _raise(ValueError(text))
    except ValueError as e:
        again = remote_errors.remote_text(e, "WorkerInfo(id=0, name=master)")
    assert again.startswith(f"On {WORKER2}:\nValueError('bad 6')\nTraceback (most recent call last):\n"
                            "  On WorkerInfo(id=0, name=master):\n"), again
    assert again.count("Traceback") == 1 and again.count(f"  On {WORKER2}:") == 1, again


def test_an_error_raised_while_handling_a_remote_one_keeps_its_own_class_and_text():
    try:
        try:
            _raise(ValueError(f"On {WORKER2}:\nValueError('bad 6')\nTraceback (most recent call last):\n"
                              '  File "/home/u/job.py", line 5, in bad\n    x\nValueError: bad 6\n'))
        except ValueError:
            _raise(KeyError("shard 3"))
    except KeyError as e:
        text = remote_errors.remote_text(e, WORKER1)
    assert text.startswith(f"On {WORKER1}:\nKeyError('shard 3')\n"), text
    assert "During handling of the above exception" in text and text.endswith("KeyError: 'shard 3'\n")


def test_tidy_leaves_out_cpp_stacks_and_nbrpc_frames_in_place():
    error = ValueError(f"On {WORKER1}:\nValueError(1)\nTraceback (most recent call last):\n"
                       '  File "/site/nbrpc/calls/interrupts.py", line 9, in _run\n    return func()\n'
                       '  File "/home/u/job.py", line 5, in bad\n    x\nValueError: 1\n\nAt:\n  /site/a.py(3): h\n')
    assert remote_errors.tidy(error) is error
    assert str(error) == (f"On {WORKER1}:\nValueError(1)\nTraceback (most recent call last):\n"
                          '  File "/home/u/job.py", line 5, in bad\n    x\nValueError: 1')
    assert "".join(traceback.format_exception_only(error)).count("nbrpc") == 0
    plain = ValueError("not remote\n\nAt:\n  /site/a.py(3): h\n")
    assert str(remote_errors.tidy(plain)).endswith("h\n")  # not a remote error: as it is
