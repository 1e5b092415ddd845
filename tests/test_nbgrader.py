"""The labs as an nbgrader course: real ``nbgrader`` commands on a copy of ``tutorials/labs``.

The labs are dealt to a few course folders, graded side by side (each folder's gradebook
has one writer). In each, ``generate_assignment`` makes the student versions; three
students submit (the reference solution, the released notebook untouched, a partly right
one); ``autograde`` runs them in real kernels that start real clusters; ``export`` gives
the scores and ``generate_feedback`` what a student reads. No kernel and no worker
survives the grading.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from conftest import kernel_pids, wait_gone, wait_until, worker_pids
from unix_socket_kernels import nbgrader_config

LABS = Path(__file__).parent.parent / "tutorials" / "labs"
sys.path.insert(0, str(LABS.parent.parent / "docs" / "_ext"))  # the docs' lab pages
import nbrpc_docs  # noqa: E402

# Seconds each lab's three submissions take to grade here (2 loaded cores, the lanes
# beside each other; the fixture prints them): the labs are dealt to LANES course
# folders by them, graded at once, so that the lanes end together.
GRADING_SECONDS = {"01_rpc_basics": 74, "02_dist_autograd": 111, "03_param_server": 128, "04_pipeline": 88,
                   "05_rl": 45, "06_federated": 61, "07_rnn": 85, "08_hybrid": 100, "09_hangs": 86}
ASSIGNMENTS = list(GRADING_SECONDS)
# One lane: two, beside the parallel tier's other file, saved no time on 2 cores (the
# grading kernels keep them busy) and once failed to grade a submission there.
LANES = 1
# Seconds one nbgrader command may take here (2 loaded cores) before the test fails, and
# the seconds autograde may take per submission (12-30 s each here, on 2 loaded cores: a
# kernel, a cluster, the lab's cells): the course's 27 in one command take 5 to 10 minutes.
COMMAND_TIMEOUT = 500
GRADING_TIMEOUT = 60
SUBMISSIONS = 3 * len(ASSIGNMENTS)
# The first test waits for the course's grading (its fixture): all of nbgrader's commands.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3 * COMMAND_TIMEOUT + SUBMISSIONS * GRADING_TIMEOUT)]
pytest.importorskip("nbgrader", reason="nbgrader 0.9 needs Python 3.11 or newer (the `test` extra has it there)")

# A partly right submission per lab: the code cells it changes (by grade_id) with the
# reference solution ("solution") or a typical mistake; the others stay as released.
# What the test cell of each mistake must say, and the points the submission earns.
PARTLY_RIGHT = {
    "01_rpc_basics": {
        "cells": {"square_on": "solution", "ask_all": "solution", "add_remote": '''
def add_remote(counter_rref, n):
    return counter_rref.to_here().add(n)
'''},
        "messages": {"test_add_remote": "✗ rpc_basics.add_remote: the Counter on worker1 still counts 10",
                     "test_make_counter": "✗ rpc_basics.make_counter: not done yet: make_counter still "
                                          "raises NotImplementedError"},
        "points": 1 + 2,
    },
    "02_dist_autograd": {
        "cells": {"grad_through_rpc": "solution", "sgd_step": "solution", "grad_of_w": '''
def owner_grad(context_id, model_rref):
    return dist_autograd.get_gradients(context_id)[model_rref.local_value().w]


def grad_of_w(model_rref, x):
    with dist_autograd.context() as context_id:
        loss = model_rref.rpc_sync().forward(x).sum()
        dist_autograd.backward(context_id, [loss])
    return rpc.rpc_sync(model_rref.owner(), owner_grad, args=(context_id, model_rref))
'''},
        "messages": {"test_grad_of_w": "Could not find autograd context with id",
                     "test_train_split": "✗ dist_autograd.train_split: not done yet"},
        "points": 2 + 2,
    },
    "03_param_server": {
        "cells": {"parameter_rrefs": "solution", "train_step": "solution", "run_training": '''
def run_training(trainers, epochs):
    return [[] for _ in trainers]
'''},
        "messages": {"test_run_training": "✗ param_server.run_training: trainer1 trained 0 epoch(s)",
                     "test_busiest": "✗ param_server.busiest: not done yet: busiest still raises "
                                     "NotImplementedError"},
        "points": 2 + 2,
    },
    "04_pipeline": {
        "cells": {"pipeline_forward": "solution", "make_optimizer": "solution", "train_step": '''
def train_step(shard1, shard2, optimizer, x, y, micro_batches):
    loss = F.cross_entropy(pipeline_forward(shard1, shard2, x, micro_batches), y)
    loss.backward()
    return loss.item()
'''},
        "messages": {"test_train_step": "✗ pipeline.train_step: the forward pass ran outside a "
                                        "dist_autograd context"},
        "points": 3 + 2,
    },
    "05_rl": {
        "cells": {"discounted_returns": "solution", "play_round": "solution", "select_action": '''
@rpc.functions.async_execution
def select_action(agent_rref, observer_id, state):
    action = torch.futures.Future()
    action.set_result(agent_rref.local_value().act(torch.as_tensor(state, dtype=torch.float32)[None])[0].item())
    return action
'''},
        "messages": {"test_select_action": "✗ rl.select_action: the agent ran its policy 4 times"},
        "points": 2 + 3,
    },
    "06_federated": {
        "cells": {"weighted_average": "solution", "fedavg_round": "solution", "round_with_deadline": '''
def round_with_deadline(model, clients, round_no, deadline):
    futures = [c.rpc_async().train(model.state_dict(), round_no) for c in clients]
    states, counts = zip(*[f.wait() for f in futures])
    model.load_state_dict(weighted_average(states, counts))
    return len(counts)
'''},
        "messages": {"test_round_with_deadline": "✗ federated.round_with_deadline: the round took "},
        "points": 2 + 3,
    },
    "07_rnn": {
        "cells": {"rnn_forward": "solution", "parameter_rrefs": "solution", "train_step": '''
def train_step(emb_rref, rnn, decoder_rref, optimizer, tokens, targets, hidden):
    with dist_autograd.context() as context_id:
        output, hidden = rnn_forward(emb_rref, rnn, decoder_rref, tokens, hidden)
        loss = F.cross_entropy(output.view(-1, output.shape[-1]), targets.reshape(-1))
        dist_autograd.backward(context_id, [loss])
        optimizer.step(context_id)
    return loss.item(), hidden
'''},
        "messages": {"test_train_step": "✗ rnn.train_step: the hidden state returned still requires grad"},
        "points": 3 + 2,
    },
    "08_hybrid": {
        "cells": {"hybrid_forward": "solution", "parameter_rrefs": "solution", "train": '''
def train(emb_rref, dense, batches, lr):
    optimizer = DistributedOptimizer(torch.optim.SGD, parameter_rrefs(emb_rref, dense), lr=lr)
    losses = []
    for indices, offsets, target in batches:
        with dist_autograd.context() as context_id:
            loss = F.cross_entropy(hybrid_forward(emb_rref, dense, indices, offsets), target)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(loss.item())
    return losses
'''},
        "messages": {"test_train": "✗ hybrid.train: after 3 steps the trainers' dense layers differ"},
        "points": 2 + 2,
    },
    "09_hangs": {
        "cells": {"lock_kind": """
def lock_kind():
    return "cycle"
""", "outer_fixed": """
def outer_fixed(x):
    with lock:
        y = 2 * x
        return rpc.rpc_sync("worker1", inner, args=(y,), timeout=60)
""", "pool_kind": "solution", "wait_for_update_fixed": "solution", "caller_kind": "solution"},
        "messages": {"test_lock_kind": "✗ hangs.lock_kind: lock_kind() says 'cycle', but the graph is",
                     "test_outer_fixed": "✗ hangs.outer_fixed: outer_fixed still hangs (nbrpc: blocked): "
                                         "the lock is still held",
                     "test_rescale_fixed": "✗ hangs.rescale_fixed: not done yet: "},
        "points": 1 + 2 + 1,
    },
}


def nbgrader(course: Path, *args: str, timeout: float = COMMAND_TIMEOUT) -> None:
    """Run ``nbgrader ARGS`` in ``course``; fail with its output unless it succeeds."""
    nbgrader_at_once([course], *args, timeout=timeout)


def nbgrader_at_once(courses: list[Path], *args: str, timeout: float = COMMAND_TIMEOUT) -> list[float]:
    """Run ``nbgrader ARGS`` in each of ``courses`` at once; returns each run's seconds.

    Fails with a run's output if it fails or is still running after ``timeout`` seconds
    (then every run still going is ended, with the kernels it started)."""
    # nbgrader runs its environment's `alembic` by name: that environment's bin comes first.
    # A kernel or worker that crashes prints its Python stacks into the output (faulthandler).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONFAULTHANDLER": "1"}
    outputs = [tempfile.TemporaryFile("w+") for _ in courses]  # not pipes: no run waits on a full one
    began = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "nbgrader", *args], cwd=course, env=env, stdout=output,
                              stderr=subprocess.STDOUT, start_new_session=True)
             for course, output in zip(courses, outputs)]
    took: dict[int, float] = {}
    try:
        while len(took) < len(procs) and time.monotonic() - began < timeout:
            took.update((i, time.monotonic() - began) for i, proc in enumerate(procs)
                        if i not in took and proc.poll() is not None)
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)  # nbgrader and the kernel it runs; their workers follow the kernel
                proc.wait()
    for i, (proc, output) in enumerate(zip(procs, outputs)):
        output.seek(0)
        out = output.read()
        output.close()
        if i not in took:
            pytest.fail(f"nbgrader {' '.join(args)} hung for {timeout} s in {courses[i]}:\n{excerpt(out)}")
        assert proc.returncode == 0, f"nbgrader {' '.join(args)} failed in {courses[i]}:\n{excerpt(out)}"
    return [took[i] for i in range(len(procs))]


def excerpt(output: str) -> str:
    """An nbgrader command's output, shortened: around each submission it failed to process
    (what its kernel printed last, the traceback nbgrader logged; often long before the
    end), then the output's end."""
    failures = [m.start() for m in re.finditer("There was an error processing assignment: ", output)]
    return "".join(f"...{output[max(0, at - 2000):at + 3000]}\n...\n" for at in failures) + output[-3000:]


def cells(notebook) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells if "nbgrader" in c.metadata}


def submit(course: Path, student: str, assignment: str, notebook) -> None:
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True)
    nbformat.write(notebook, folder / f"{assignment}.ipynb")


def errors(cell) -> str:
    return "\n".join("\n".join(o.traceback) for o in cell.get("outputs", []) if o.output_type == "error")


def copy_config(folder: Path) -> None:
    """The course's nbgrader config in ``folder``, its grading kernels on Unix sockets."""
    shutil.copy(LABS / "nbgrader_config.py", folder)
    with open(folder / "nbgrader_config.py", "a") as config:
        config.write(nbgrader_config())


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> dict:
    """The labs course, graded: each lab's course folder, and what outlived the grading.

    The labs are graded in ``LANES`` course folders at once (a kernel grading a submission
    mostly waits on its cluster), each with its own gradebook: nbgrader's sqlite database
    takes one writer. In each folder every lab is released, submitted by three students,
    autograded, exported and fed back, one nbgrader command per step for all its labs.
    """
    lanes = deal(GRADING_SECONDS, LANES)
    folders = [tmp_path_factory.mktemp("course") for _ in lanes]
    for folder, labs in zip(folders, lanes):
        copy_config(folder)
        for assignment in labs:
            shutil.copytree(LABS / "source" / assignment, folder / "source" / assignment)
    workers_before, kernels_before = worker_pids(), kernel_pids()
    began = time.monotonic()
    nbgrader_at_once(folders, "generate_assignment", "*")
    for folder, labs in zip(folders, lanes):
        for assignment in labs:
            submit_three(folder, assignment)
    since = time.time()
    grading = nbgrader_at_once(folders, "autograde", "*", "--create",
                               timeout=GRADING_TIMEOUT * max(3 * len(labs) for labs in lanes))
    # Every worker ends with the kernel that started it; no kernel outlives its notebook.
    survivors = wait_gone(worker_pids() - workers_before, timeout=15)
    kernels = wait_until(lambda: not (kernel_pids() - kernels_before), timeout=15)
    nbgrader_at_once(folders, "export")
    nbgrader_at_once(folders, "generate_feedback", "*")
    print(f"\nnbgrader: autograde of {3 * len(ASSIGNMENTS)} submissions in {len(lanes)} lanes "
          f"{max(grading):.0f} s, all commands {time.monotonic() - began:.0f} s", file=sys.stderr)
    for folder, labs, seconds in zip(folders, lanes, grading):
        each = ", ".join(f"{lab} {s:.0f} s" for lab, s in lab_seconds(folder, labs, since).items())
        print(f"  a lane autograded in {seconds:.0f} s: {each}", file=sys.stderr)
    return {"folders": {lab: folder for folder, labs in zip(folders, lanes) for lab in labs},
            "survivors": survivors, "kernels": kernels}


def deal(seconds: dict[str, float], count: int) -> list[list[str]]:
    """The labs dealt to ``count`` lanes, longest first, each to the lane with least so far."""
    lanes: list[list[str]] = [[] for _ in range(count)]
    for lab in sorted(seconds, key=seconds.get, reverse=True):
        min(lanes, key=lambda lane: sum(seconds[other] for other in lane)).append(lab)
    return lanes


def submit_three(folder: Path, assignment: str) -> None:
    """The three students' submissions of a released lab: solved, untouched, partly right."""
    source, released = notebooks(folder, assignment, "source", "release")
    submit(folder, "untouched", assignment, released)
    solved = copy(released)
    for grade_id, cell in cells(solved).items():
        if cell.metadata["nbgrader"]["solution"]:
            cell.source = cells(source)[grade_id].source
    submit(folder, "solved", assignment, solved)
    partly = copy(released)
    for grade_id, answer in PARTLY_RIGHT[assignment]["cells"].items():
        cells(partly)[grade_id].source = cells(source)[grade_id].source if answer == "solution" else answer
    submit(folder, "partly", assignment, partly)


def lab_seconds(folder: Path, labs: list[str], since: float) -> dict[str, float]:
    """How long each lab's three submissions took to grade, from when each autograded
    notebook was written (nbgrader grades one after another, student by student) and
    when grading began (``since``, a ``time.time()``)."""
    written = [(since, "")] + sorted((path.stat().st_mtime, path.parent.name)
                                     for path in folder.glob("autograded/*/*/*.ipynb"))
    took = dict.fromkeys(labs, 0.0)
    for (before, _), (after, lab) in zip(written, written[1:]):
        took[lab] += after - before
    return took


def notebooks(folder: Path, assignment: str, *where: str) -> list[nbformat.NotebookNode]:
    return [nbformat.read(folder / w / assignment / f"{assignment}.ipynb", as_version=4) for w in where]


def copy(notebook) -> nbformat.NotebookNode:
    return nbformat.from_dict(json.loads(json.dumps(notebook)))


def test_no_worker_or_kernel_outlives_the_grading(course):
    assert not course["survivors"], f"workers outlived the grading: {sorted(course['survivors'])}"
    assert course["kernels"], f"kernels outlived the grading: {sorted(kernel_pids())}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_generate_assignment_makes_the_student_version(course, assignment):
    check_release(*notebooks(course["folders"][assignment], assignment, "source", "release"))


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_docs_lab_page_is_what_generate_assignment_releases(course, assignment):
    """Each lab page's cells (the docs' student version, ``docs/_ext/nbrpc_docs.py``) are the
    sources ``nbgrader generate_assignment`` released."""
    source = json.loads((LABS / "source" / assignment / f"{assignment}.ipynb").read_text())
    (released,) = notebooks(course["folders"][assignment], assignment, "release")
    ours = nbrpc_docs.student_version(source)
    assert [c["source"] for c in ours["cells"]] == [c.source for c in released.cells], "the page differs"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_autograde_scores_each_kind_of_submission(course, assignment):
    folder = course["folders"][assignment]
    with open(folder / "grades.csv") as f:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
                  for row in csv.DictReader(f) if row["assignment"] == assignment}
    (source,) = notebooks(folder, assignment, "source")
    points = sum(c.metadata["nbgrader"].get("points", 0) for c in source.cells)
    assert scores == {"solved": (points, points), "untouched": (0.0, points),
                      "partly": (PARTLY_RIGHT[assignment]["points"], points)}

    graded = {student: cells(notebooks(folder, assignment, f"autograded/{student}")[0]) for student in scores}
    tests = [g for g, c in cells(source).items() if c.metadata["nbgrader"]["grade"]]
    assert not [g for g, c in graded["solved"].items() if errors(c)], "the reference solution failed a cell"
    for grade_id in tests:  # the hidden tests ran too
        assert "### BEGIN HIDDEN TESTS" in graded["solved"][grade_id].source
        message = errors(graded["untouched"][grade_id])
        assert message.startswith("✗ ") and ": not done yet: " in message and "\n    hint: " in message, message
    untouched = [g for g, c in graded["untouched"].items() if errors(c)]
    assert untouched == tests, "only test cells may fail in the released notebook"
    for grade_id, expected in PARTLY_RIGHT[assignment]["messages"].items():
        assert expected in errors(graded["partly"][grade_id]), errors(graded["partly"][grade_id])

    feedback = (folder / "feedback" / "partly" / assignment / f"{assignment}.html").read_text()
    assert f"Score: {PARTLY_RIGHT[assignment]['points']:.1f} / {points:.1f}" in feedback
    assert "✗ " in feedback and "hint: " in feedback


def check_release(source, released) -> None:
    """What generate_assignment made: solutions and hidden tests out, outputs cleared, the rest kept."""
    before, after = cells(source), cells(released)
    assert list(before) == list(after)
    for grade_id, cell in after.items():
        assert "BEGIN SOLUTION" not in cell.source and "HIDDEN TESTS" not in cell.source
        assert not cell.get("outputs")
        if cell.metadata["nbgrader"]["solution"]:
            assert "raise NotImplementedError()" in cell.source and "# TODO" in cell.source
        elif cell.metadata["nbgrader"]["grade"]:
            assert cell.source == before[grade_id].source.split("\n### BEGIN HIDDEN TESTS")[0]
        else:
            assert cell.source == before[grade_id].source


# The worker's loop spins at the lowest priority (nice 19): as deaf and endless, but the
# CPU it would burn goes to the tests beside it.
RUNAWAY = '''
def spin(rref):
    __import__("os").nice(19)
    while True:
        pass


def double_on_owner(rref):
    while True:  # and deaf to the interrupt at the time limit
        try:
            rpc.rpc_sync(rref.owner(), spin, args=(rref,))
        except BaseException:
            pass
'''


def test_a_runaway_submission_is_stopped_and_leaves_nothing(tmp_path):
    # Lab 1 solved but for its last exercise, which loops for ever here and on a worker
    # and ignores the interrupt: its test cell, the score cell and %rpc_shutdown each run
    # into the time limit, and nbgrader kills the kernel at the end.
    folder, assignment = tmp_path, "01_rpc_basics"
    copy_config(folder)
    shutil.copytree(LABS / "source" / assignment, folder / "source" / assignment)
    nbgrader(folder, "generate_assignment", assignment)
    source, runaway = notebooks(folder, assignment, "source", "release")
    for grade_id, cell in cells(runaway).items():
        if cell.metadata["nbgrader"]["solution"]:
            cell.source = RUNAWAY if grade_id == "double_on_owner" else cells(source)[grade_id].source
    submit(folder, "runaway", assignment, runaway)
    workers_before, kernels_before = worker_pids(), kernel_pids()
    began = time.monotonic()
    nbgrader(folder, "autograde", assignment, "--student", "runaway", "--create", "--Execute.timeout=20")
    print(f"\nnbgrader: a runaway submission graded in {time.monotonic() - began:.0f} s", file=sys.stderr)
    assert not wait_gone(worker_pids() - workers_before, timeout=15), "a worker outlived its kernel"
    assert wait_until(lambda: not (kernel_pids() - kernels_before), timeout=15)

    graded = cells(notebooks(folder, assignment, "autograded/runaway")[0])
    stopped = errors(graded["test_double_on_owner"])
    assert "✗ this cell ran past the time limit and was stopped" in stopped and "hint: look for a loop" in stopped
    assert [g for g, c in graded.items() if errors(c)] == ["test_double_on_owner", "code_07", "code_08"]
    nbgrader(folder, "export")
    with open(folder / "grades.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["student_id"] == "runaway" and r["assignment"] == assignment]
    assert [(float(r["score"]), float(r["max_score"])) for r in rows] == [(6.0, 8.0)]
