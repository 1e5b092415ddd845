"""pdb on workers, prompting in the calling cell, in a real notebook kernel.

The notebook's kernel is a real ipykernel driven over the Jupyter protocol as a front
end does: cells run with ``allow_stdin``, and each ``input_request`` on the stdin channel
is answered as a person would type (``p y``, ``n``, ``c``). One cluster for the module.
"""

from __future__ import annotations

import queue
import re
import time

import pytest
from conftest import execute, streamed, wait_gone
from unix_socket_kernels import UnixSocketKernelManager

pytestmark = pytest.mark.slow

DEFINITIONS = '''
import torch.distributed.rpc as rpc

def stepped(x):
    y = x + 1
    breakpoint()
    z = y * 2
    return z

def boom(x):
    secret = x * 7
    raise ValueError(f"boom with {x}")

def via(other, x):
    return rpc.rpc_sync(other, stepped, args=(x,))

class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        breakpoint()
        return self.n
'''


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    """A notebook kernel running ``%rpc_init -n 2`` with the module's definitions."""
    km = UnixSocketKernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path_factory.mktemp("notebook")))
    kc = km.client()
    kc.start_channels()
    pid = km.provisioner.pid
    try:
        kc.wait_for_ready(timeout=120)
        _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 2 --timeout 120", timeout=240)
        assert reply["status"] == "ok", reply
        _, reply = execute(kc, DEFINITIONS)
        assert reply["status"] == "ok", reply
        yield kc
        execute(kc, "%rpc_shutdown", timeout=120)
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        km.cleanup_resources()
        assert not wait_gone([pid], timeout=5)


def typed(kc, code: str, answers: list, timeout: float = 120) -> tuple[list[dict], dict, list[str]]:
    """Run ``code`` with stdin; answer its input requests with ``answers`` in turn.
    Returns the IOPub messages, the reply and the prompts asked."""
    msg_id = kc.execute(code, allow_stdin=True)
    answers, prompts, messages = list(answers), [], []
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        assert time.monotonic() < deadline, (prompts, streamed(messages), streamed(messages, "stderr"))
        try:
            request = kc.get_stdin_msg(timeout=0.05)
        except queue.Empty:
            request = None
        if request is not None and request["msg_type"] == "input_request":
            prompts.append(request["content"]["prompt"])
            assert answers, f"an input request nobody expected: {prompts[-1]!r}\n{streamed(messages)}"
            answer = answers.pop(0)
            if isinstance(answer, tuple):  # (seconds the person thinks, what they type)
                time.sleep(answer[0])
                answer = answer[1]
            kc.input(answer)
        while kc.iopub_channel.msg_ready():
            msg = kc.get_iopub_msg(timeout=1)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
            else:
                messages.append(msg)
    while True:
        reply = kc.get_shell_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg_id:
            return messages, reply["content"], prompts


def result(messages: list[dict]) -> str:
    return "".join(m["content"]["data"]["text/plain"] for m in messages if m["msg_type"] == "execute_result")


def test_breakpoint_in_rpc_sync_prompts_in_the_cell_and_the_call_returns(notebook):
    messages, reply, prompts = typed(notebook, 'rpc.rpc_sync("worker1", stepped, args=(3,))',
                                     ["p y", "n", "n", "p z", "l", "w", "c"])
    assert reply["status"] == "ok", reply
    assert prompts and all(p == "(Pdb) [worker1] " for p in prompts), prompts
    out = streamed(messages)
    assert "> Cell In[2], line 6: stepped()\n-> z = y * 2" in out, out  # where breakpoint() stopped
    assert "\n4\n" in out and "\n8\n" in out, out  # p y, then p z after two steps
    assert "    y = x + 1" in out, out  # l lists the driver's cell, which the worker lacks
    assert "nbrpc/" not in out and "torch/" not in out, out  # w: the function's frames only
    assert result(messages) == "8"


def test_without_stdin_one_line_says_so_and_the_call_goes_on(notebook):
    messages, reply = execute(notebook, 'rpc.rpc_sync("worker1", stepped, args=(1,))', allow_stdin=False)
    assert reply["status"] == "ok", reply
    assert result(messages) == "4"
    err = streamed(messages, "stderr")
    lines = [line for line in err.splitlines() if "no debugger prompt" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("[worker1] breakpoint() in stepped (Cell In[2], line 5): "), lines


def test_breakpoint_in_remote_and_rpc_async_prompts_too(notebook):
    code = ('fut = rpc.rpc_async("worker2", stepped, args=(10,))\n'
            'rref = rpc.remote("worker1", stepped, args=(20,))\n'
            '(fut.wait(), rref.to_here())')
    messages, reply, prompts = typed(notebook, code, ["p y", "c", "p y", "c"])
    assert reply["status"] == "ok", reply
    assert sorted(prompts) == ["(Pdb) [worker1] "] * 2 + ["(Pdb) [worker2] "] * 2, prompts
    out = streamed(messages)
    assert "\n11\n" in out and "\n21\n" in out, out
    assert result(messages) == "(22, 42)"


def test_breakpoint_in_a_method_called_through_an_rref_proxy(notebook):
    code = 'counter = rpc.remote("worker2", Counter)\ncounter.rpc_sync().add(5)'
    messages, reply, prompts = typed(notebook, code, ["p self.n", "w", "c"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb) [worker2] "] * 3, prompts
    out = streamed(messages)
    assert "\n5\n" in out and "torch/" not in out, out
    assert result(messages) == "5"


def test_a_worker_calling_a_worker_prompts_in_the_root_cell(notebook):
    messages, reply, prompts = typed(notebook, 'rpc.rpc_sync("worker1", via, args=("worker2", 5))',
                                     ["p x", "c"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb) [worker2] "] * 2, prompts
    assert "\n5\n" in streamed(messages)
    assert result(messages) == "12"


@pytest.mark.parametrize("call, x", [('rpc.rpc_sync("worker1", boom, args=(6,))', 6),
                                     ('rpc.rpc_async("worker1", boom, args=(5,)).wait()', 5)])
def test_debug_after_a_remote_error_opens_the_workers_frames(notebook, call, x):
    """Also after a future's wait, which raises with no frame of nbrpc's under the cell's:
    %debug still knows the call it came from."""
    messages, reply = execute(notebook, call)
    assert reply["status"] == "error" and reply["ename"] == "ValueError", reply
    messages, reply, prompts = typed(notebook, "%debug", ["p secret", "p x", "q"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb) [worker1] "] * 3, prompts
    out = streamed(messages)
    assert f"\n{x * 7}\n{x}\n" in out, out  # boom's locals: secret, x
    assert 'raise ValueError(f"boom with {x}")' in out, out


def test_debug_after_to_here_raised_opens_the_owners_frames(notebook):
    messages, reply = execute(notebook, 'rref = rpc.remote("worker2", boom, args=(4,))\nrref.to_here()')
    assert reply["status"] == "error" and reply["ename"] == "ValueError", reply
    messages, reply, prompts = typed(notebook, "%debug", ["p secret", "p x", "q"])
    assert reply["status"] == "ok", reply
    assert prompts == ["(Pdb) [worker2] "] * 3, prompts
    out = streamed(messages)
    assert "nbrpc: ValueError was raised on worker2" in out, out
    assert "\n28\n4\n" in out, out
    assert 'raise ValueError(f"boom with {x}")' in out, out


def test_debug_after_a_local_error_is_ipythons(notebook):
    _, reply = execute(notebook, "def local(v):\n    inside = v + 100\n    raise KeyError(v)\nlocal(1)")
    assert reply["status"] == "error", reply
    messages, reply, prompts = typed(notebook, "%debug", ["p inside", "q"])
    assert reply["status"] == "ok", reply
    assert prompts and "[worker" not in prompts[0], prompts
    assert "101" in streamed(messages)


def test_rpc_on_cells_take_input(notebook):
    code = '%%rpc_on worker1\nname = input("who? ")\nprint("hello", name)'
    messages, reply, prompts = typed(notebook, code, ["ada"])
    assert reply["status"] == "ok", reply
    assert prompts == ["[worker1] who? "], prompts
    assert "[worker1] hello ada" in streamed(messages)


def test_a_call_paused_past_its_timeout_returns_its_value(notebook):
    code = ('a = rpc.rpc_sync("worker1", stepped, args=(3,), timeout=1)\n'
            'b = rpc.rpc_async("worker2", stepped, args=(4,), timeout=1).wait()\n'
            '(a, b)')
    messages, reply, prompts = typed(notebook, code, [(2.5, "p y"), "c", (2.5, "p y"), "c"])
    assert reply["status"] == "ok", (reply, streamed(messages, "stderr"))
    assert prompts == ["(Pdb) [worker1] "] * 2 + ["(Pdb) [worker2] "] * 2, prompts
    assert result(messages) == "(8, 10)"
    out = streamed(messages)
    assert "\n4\n" in out and "\n5\n" in out, out


def test_a_paused_call_reads_as_paused_not_as_a_hang(notebook):
    code = """
import threading, time, nbrpc
from nbrpc.calls import prompts
box = {}
t = threading.Thread(target=lambda: box.update(v=rpc.rpc_sync("worker1", stepped, args=(3,))))
t.start()
paused = []
for _ in range(300):
    snap = nbrpc.waits()
    paused = [c for c in snap["calls"] if c["state"] == "paused"]
    if paused:
        break
    time.sleep(0.1)
print("PAUSED", paused[0]["paused_at"], paused[0]["function"], snap["findings"])
time.sleep(2)  # longer than a finding takes to show
print("FINDINGS", nbrpc.waits()["findings"])
while t.is_alive():
    prompts.answer_waiting()
    time.sleep(0.05)
box["v"]
"""
    messages, reply, prompts = typed(notebook, code, ["c"])
    assert reply["status"] == "ok", reply
    out = streamed(messages)
    assert re.search(r"PAUSED cell 2, line 6 stepped \[\]", out), out
    assert "FINDINGS []" in out, out
    assert result(messages) == "8"


def test_breakpoint_in_an_rpc_on_cell_prompts_through_the_workers_kernel(notebook):
    code = "%%rpc_on worker1\ndef g(x):\n    y = x + 1\n    breakpoint()\n    return y * 2\nprint('g is', g(5))"
    messages, reply, prompts = typed(notebook, code, ["p y", "p x", "c"])
    assert reply["status"] == "ok", reply
    assert prompts == ["[worker1] ipdb> "] * 3, prompts  # IPython's pdb, as in a notebook cell
    out = streamed(messages)
    assert "[worker1] 6\n[worker1] 5\n" in out and "[worker1] g is 12" in out, out


def test_a_chain_that_waits_on_a_paused_call_is_no_hang(notebook):
    code = """
import threading, time, nbrpc
from nbrpc.calls import prompts
box = {}
t = threading.Thread(target=lambda: box.update(v=rpc.rpc_sync("worker1", via, args=("worker2", 5))))
t.start()
for _ in range(300):
    snap = nbrpc.waits()
    if any(c["state"] == "paused" for c in snap["calls"]):
        break
    time.sleep(0.1)
time.sleep(2)  # longer than a finding takes to show
snap = nbrpc.waits()
print("CALLS", sorted((c["callee"], c["function"], c["state"]) for c in snap["calls"]))
print("FINDINGS", snap["findings"])
while t.is_alive():
    prompts.answer_waiting()
    time.sleep(0.05)
box["v"]
"""
    messages, reply, prompts = typed(notebook, code, ["c"])
    assert reply["status"] == "ok", reply
    out = streamed(messages)
    assert "CALLS [('worker1', 'via', 'waiting'), ('worker2', 'stepped', 'paused')]" in out, out
    assert "FINDINGS []" in out, out
    assert result(messages) == "12"
