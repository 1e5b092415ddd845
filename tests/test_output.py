"""What a function prints on a worker shows in the cell that made the call.

One notebook runs every case through nbclient in a real kernel with a real cluster
(``notebook``); each test reads the outputs of its own cell. Output that arrives
while no cell runs is checked in a real kernel driven by hand, with a pause between
two cells (``test_background_output_with_no_cell_running_goes_to_the_next_cell``).
"""

from __future__ import annotations

import time

import pytest
from conftest import cell_text, execute, execute_cells, streamed

from nbrpc.calls.output import LineTagger

SETUP = '''\
import logging, sys, threading, time, warnings
import torch.distributed.rpc as rpc
from IPython.display import clear_output, display

def f(x):
    print("hello", x)
    return x + 1

class Counter:
    def __init__(self):
        self.n = 0
    def add(self, k):
        self.n += k
        print("added", k, "now", self.n)
        return self.n

def outer(x):
    print("outer", x)
    return rpc.rpc_sync("worker2", f, args=(x,))

def count(n, who):
    for i in range(n):
        print(who, i)

def complain(x):
    print("to stderr", x, file=sys.stderr)
    warnings.warn("careful with " + str(x))
    logging.getLogger("trainer").warning("loss is %s", x)
    return x

def fails(x):
    raise ValueError(f"bad {x}")

def later(delay, text):
    threading.Thread(target=lambda: (time.sleep(delay), print(text))).start()

def progress(n):
    for i in range(n):
        clear_output(wait=True)
        print("step", i)

def updating(n):
    shown = display("start", display_id=True)
    for i in range(n):
        shown.update(f"step {i}")
'''

CELLS = {
    "start": "%load_ext nbrpc\n%rpc_init -n 2",
    "setup": SETUP,
    "rpc_sync": 'rpc.rpc_sync("worker1", f, args=(1,))',
    "rpc_async": 'rpc.rpc_async("worker2", f, args=(2,)).wait()',
    "remote": 'rpc.remote("worker1", f, args=(3,)).to_here()',
    "rref_method": 'counter = rpc.remote("worker2", Counter)\ncounter.rpc_sync().add(5)',
    "nested": 'rpc.rpc_sync("worker1", outer, args=(4,))',
    "order": ('futs = [rpc.rpc_async(w, count, args=(100, w)) for w in ("worker1", "worker2")]\n'
              'for fut in futs:\n    fut.wait()'),
    "stderr": 'rpc.rpc_sync("worker1", complain, args=(7,))',
    "raises": 'try:\n    rpc.rpc_sync("worker1", fails, args=(8,))\nexcept ValueError as e:\n    print("caught", e)',
    "after_raise": "1 + 1",
    "background_running": 'rpc.rpc_sync("worker2", later, args=(0.5, "late news"))\ntime.sleep(3)',
    "rpc_on_clear": ("%%rpc_on worker1\nfrom IPython.display import clear_output\n"
                     "for i in range(3):\n    clear_output(wait=True)\n    print('step', i)"),
    "rpc_on_update": ("%%rpc_on worker1\nshown = display('start', display_id=True)\n"
                      "for i in range(3):\n    shown.update(f'step {i}')"),
    "call_clear": 'rpc.rpc_sync("worker1", progress, args=(3,))',
    "call_update": 'rpc.rpc_sync("worker2", updating, args=(3,))',
    "shutdown": "%rpc_shutdown",
}


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    """Every cell of ``CELLS`` run in order in a fresh kernel: name -> executed cell."""
    executed = execute_cells(tmp_path_factory.mktemp("output"), list(CELLS.values()), timeout=240)
    return dict(zip(CELLS, executed.cells))


def test_rpc_sync_print_shows_in_the_calling_cell(notebook):
    cell = notebook["rpc_sync"]
    assert cell_text(cell) == "[worker1] hello 1\n"
    assert cell_text(cell, "execute_result") == "2"


def test_rpc_async_print_shows_in_the_calling_cell(notebook):
    assert cell_text(notebook["rpc_async"]) == "[worker2] hello 2\n"


def test_remote_print_shows_in_the_calling_cell(notebook):
    assert cell_text(notebook["remote"]) == "[worker1] hello 3\n"
    assert cell_text(notebook["remote"], "execute_result") == "4"


def test_rref_method_print_shows_in_the_calling_cell(notebook):
    assert cell_text(notebook["rref_method"]) == "[worker2] added 5 now 5\n"


def test_nested_call_lands_in_the_drivers_cell_in_order(notebook):
    # worker1 printed before it called worker2, so its line comes first.
    assert cell_text(notebook["nested"]) == "[worker1] outer 4\n[worker2] hello 4\n"
    assert cell_text(notebook["nested"], "execute_result") == "5"


def test_each_workers_lines_arrive_whole_and_in_order(notebook):
    lines = cell_text(notebook["order"]).splitlines()
    for worker in ("worker1", "worker2"):
        mine = [line for line in lines if line.startswith(f"[{worker}] ")]
        assert mine == [f"[{worker}] {worker} {i}" for i in range(100)]
    assert len(lines) == 200


def test_stderr_warnings_and_logging_show_tagged(notebook):
    cell = notebook["stderr"]
    err = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stderr")
    lines = err.splitlines()
    assert lines[0] == "[worker1] to stderr 7"
    assert any(line.startswith("[worker1] ") and "UserWarning: careful with 7" in line for line in lines)
    assert lines[-1] == "[worker1] loss is 7"
    assert all(line.startswith("[worker1] ") for line in lines)


def test_a_failing_calls_traceback_on_the_worker_shows_in_its_own_cell(notebook):
    # torch prints a failing function's error on the worker's stderr, as in a script; it
    # is the call's output, shown before the caller handles the error, never in a later cell
    cell = notebook["raises"]
    streams = [(o.name, o.text) for o in cell.outputs if o.output_type == "stream"]
    err = "".join(text for name, text in streams if name == "stderr").splitlines()
    assert err[0] == "[worker1] On WorkerInfo(id=1, name=worker1):"
    assert err[1] == "[worker1] ValueError('bad 8')" and "[worker1] Traceback (most recent call last):" in err
    # the caller's own print comes after all of it (a print may arrive in several stream messages)
    first_out = next(i for i, (name, _) in enumerate(streams) if name == "stdout")
    assert all(name == "stdout" for name, _ in streams[first_out:])
    out = "".join(text for _, text in streams[first_out:])
    assert out.startswith("caught ") and "bad 8" in out
    assert notebook["after_raise"].outputs[0].output_type == "execute_result"
    assert [o.output_type for o in notebook["after_raise"].outputs] == ["execute_result"]


def test_background_output_goes_to_the_cell_running_at_the_time(notebook):
    assert cell_text(notebook["background_running"]) == "[worker2] late news\n"


def _kinds(cell) -> list[str]:
    return [o.output_type for o in cell.outputs]


def test_rpc_on_clear_output_clears_the_cell(notebook):
    cell = notebook["rpc_on_clear"]
    assert _kinds(cell) == ["stream"]
    assert cell_text(cell) == "[worker1] step 2\n"


def test_rpc_on_update_display_updates_in_place(notebook):
    cell = notebook["rpc_on_update"]
    assert _kinds(cell) == ["display_data"]
    assert cell.outputs[0].data["text/plain"] == "'step 2'"


def test_clear_output_in_a_call_clears_the_calling_cell(notebook):
    cell = notebook["call_clear"]
    assert _kinds(cell) == ["stream"]
    assert cell_text(cell) == "[worker1] step 2\n"


def test_update_display_in_a_call_updates_in_place(notebook):
    cell = notebook["call_update"]
    assert _kinds(cell) == ["display_data"]
    assert cell.outputs[0].data["text/plain"] == "'step 2'"


@pytest.mark.slow  # a notebook kernel of its own, and a cluster in it
def test_background_output_with_no_cell_running_goes_to_the_next_cell(kernel):
    _, client = kernel
    for code in ("%load_ext nbrpc", "%rpc_init -n 1", SETUP):
        _, reply = execute(client, code)
        assert reply["status"] == "ok", reply
    started, reply = execute(client, 'rpc.rpc_sync("worker1", later, args=(0.3, "while idle"))')
    assert reply["status"] == "ok", reply
    time.sleep(2)  # the line is written now, while no cell runs
    following, reply = execute(client, "1 + 1")
    assert reply["status"] == "ok", reply
    assert streamed(started) == ""
    assert streamed(following) == "[worker1] while idle\n"
    _, reply = execute(client, "%rpc_shutdown")
    assert reply["status"] == "ok", reply


class Collected:
    def __init__(self):
        self.texts = []

    def stream(self, worker, name, text):
        self.texts.append((name, text))


def test_line_tagger_keeps_partial_lines_and_tags_each_redraw_of_a_bar():
    shown = Collected()
    tagger = LineTagger("worker1", shown)
    for text in ("hello", " ", "1", "\n", "\r 10%|#", "\r 20%|##", "\r100%|###", "\n", "\n", "tail"):
        tagger.feed("stdout", text)
    tagger.feed("stderr", "oops\n")
    tagger.flush()
    assert shown.texts == [
        ("stdout", "[worker1] hello 1\n"),
        ("stdout", "[worker1]  10%|#\r"),
        ("stdout", "[worker1]  20%|##\r"),
        ("stdout", "[worker1] 100%|###\n"),
        ("stdout", "[worker1] \n"),
        ("stderr", "[worker1] oops\n"),
        ("stdout", "[worker1] tail\n"),
    ]
