"""nbgrader's exchange across real Unix users: a teacher releases a lab (lab 1, then lab 6,
whose grading kernels start three clients), two students fetch it, work and submit, the
teacher collects, autogrades (nbrpc clusters in the grading kernels, the course's time
limits on) and releases feedback, and each student fetches their own.

Every command runs as its user, with the exchange directory nbgrader's documentation
asks for (world-writable, set up once by root) and each user's own
``~/.jupyter/nbgrader_config.py`` naming it, as on a class's JupyterHub server; the
commands are the ones a user's terminal or the Assignments tab runs in their server.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from conftest import kernel_pids, wait_gone, wait_until, worker_pids
from users import LocalUser, unavailable

pytestmark = [pytest.mark.hub, pytest.mark.slow, pytest.mark.timeout(1500)]
pytest.importorskip("nbgrader", reason="nbgrader 0.9 needs Python 3.11 or newer (the `test` extra has it there)")

LABS = Path(__file__).parent.parent / "tutorials" / "labs"
TEACHER = "nbrpc-teacher"
SOLVED, PARTLY = "nbrpc-student-s", "nbrpc-student-p"
# Per lab: the exercises the partly right student solves, the points their test cells
# give, and the lab's points.
LABS_EXCHANGED = {
    "01_rpc_basics": (("square_on", "ask_all"), 3.0, 8.0),
    "06_federated": (("weighted_average", "fedavg_round"), 5.0, 8.0),
}
COMMAND_TIMEOUT = 500


def run_as(user: LocalUser, cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m ARGS`` as ``user`` in ``cwd``; fail with its output unless ``check`` is off."""
    options = user.popen_options()
    command = [*options.pop("prefix"), options.pop("executable"), "-m", *args]
    proc = subprocess.Popen(command, cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, **options)
    try:
        out, _ = proc.communicate(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the command and the kernel it runs; their workers follow the kernel
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(args)} as {user.name} hung for {COMMAND_TIMEOUT} s:\n{out[-3000:]}")
    if check:
        assert proc.returncode == 0, f"{' '.join(args)} as {user.name} failed:\n{out[-3000:]}"
    return subprocess.CompletedProcess(command, proc.returncode, out)


def give(path: Path, user: LocalUser) -> None:
    for part in [path, *path.rglob("*")]:
        os.chown(part, user.uid, user.gid)


def grades(notebook: nbformat.NotebookNode) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in notebook.cells if "nbgrader" in c.metadata}


@pytest.fixture(scope="module")
def server():
    """The users, the exchange and the teacher's course folder; removed afterwards."""
    if reason := unavailable():
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="nbx-"))
    root.chmod(0o755)
    exchange = root / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)  # nbgrader's set-up: `chmod ugo+rw` on the exchange root
    # nbgrader runs `alembic` by name for a new gradebook: the teacher's PATH finds one
    # with the Python every user can run.
    tools = root / "bin"
    tools.mkdir()
    (tools / "alembic").write_text('#!/bin/sh\nexec /usr/bin/python3 -m alembic "$@"\n')
    (tools / "alembic").chmod(0o755)
    # nbconvert's templates (feedback, the student version) from this environment's data;
    # not its kernel specs, which name an interpreter other users cannot run.
    data = root / "share" / "jupyter"
    data.mkdir(parents=True)
    (data / "nbconvert").symlink_to(Path(sys.prefix) / "share" / "jupyter" / "nbconvert")
    for part in (root / "share", data):
        part.chmod(0o755)
    users = {name: LocalUser.make(name) for name in (TEACHER, SOLVED, PARTLY)}
    for user in users.values():
        user.extra_env["JUPYTER_PATH"] = str(data)
    users[TEACHER].extra_env["PATH"] = f"{tools}:/usr/bin:/bin"
    for user in users.values():
        config = user.home / ".jupyter" / "nbgrader_config.py"
        config.parent.mkdir()
        config.write_text(f'c = get_config()\nc.Exchange.root = "{exchange}"\n'
                          'c.CourseDirectory.course_id = "nbrpc-labs"\n')
        give(user.home, user)
    course = users[TEACHER].home / "course"
    course.mkdir()
    shutil.copy(LABS / "nbgrader_config.py", course)
    for lab in LABS_EXCHANGED:
        shutil.copytree(LABS / "source" / lab, course / "source" / lab)
    give(course, users[TEACHER])
    yield {"users": users, "exchange": exchange, "course": course}
    for user in users.values():
        user.remove_home()
    shutil.rmtree(root, ignore_errors=True)


def work(notebook_path: Path, source: nbformat.NotebookNode, solve) -> None:
    """A student's work: the exercises ``solve`` names answered with the reference solution."""
    notebook = nbformat.read(notebook_path, as_version=4)
    for grade_id, cell in grades(notebook).items():
        if cell.metadata["nbgrader"]["solution"] and solve(grade_id):
            cell.source = grades(source)[grade_id].source
    nbformat.write(notebook, notebook_path)


@pytest.mark.parametrize("lab", LABS_EXCHANGED)
def test_a_lab_goes_from_the_teacher_to_two_students_and_their_feedback_back(server, lab):
    partly_solved, partly_points, all_points = LABS_EXCHANGED[lab]
    users, course, exchange = server["users"], server["course"], server["exchange"]
    teacher, solved, partly = users[TEACHER], users[SOLVED], users[PARTLY]

    run_as(teacher, course, "nbgrader", "generate_assignment", lab)
    run_as(teacher, course, "nbgrader", "release_assignment", lab)
    outbound = exchange / "nbrpc-labs" / "outbound" / lab / f"{lab}.ipynb"
    assert outbound.stat().st_uid == teacher.uid

    source = nbformat.read(course / "source" / lab / f"{lab}.ipynb", as_version=4)
    for student, solve in ((solved, lambda g: True), (partly, lambda g: g in partly_solved)):
        fetched = run_as(student, student.home, "nbgrader", "fetch_assignment", lab).stdout
        mine = student.home / lab / f"{lab}.ipynb"
        assert mine.stat().st_uid == student.uid, fetched
        assert "BEGIN SOLUTION" not in mine.read_text()  # the student version, not the teacher's
        work(mine, source, solve)
        run_as(student, student.home, "nbgrader", "submit", lab)

    # The inbound box takes submissions but lists nobody's: a student cannot see another's.
    inbound = exchange / "nbrpc-labs" / "inbound"
    looked = subprocess.run(["setpriv", f"--reuid={partly.uid}", f"--regid={partly.gid}", "--clear-groups",
                             "ls", str(inbound)], capture_output=True, text=True)
    assert looked.returncode != 0 and "Permission denied" in looked.stderr, looked
    assert not stat.S_IROTH & inbound.stat().st_mode

    run_as(teacher, course, "nbgrader", "collect", lab)
    assert sorted(p.name for p in (course / "submitted").iterdir()) == sorted([SOLVED, PARTLY])

    workers_before, kernels_before = worker_pids(), kernel_pids()
    run_as(teacher, course, "nbgrader", "autograde", lab, "--create")
    assert not wait_gone(worker_pids() - workers_before, timeout=15), "a worker outlived the grading"
    assert wait_until(lambda: not (kernel_pids() - kernels_before), timeout=15), "a kernel outlived the grading"
    graded = {s: grades(nbformat.read(course / "autograded" / s / lab / f"{lab}.ipynb", as_version=4))
              for s in (SOLVED, PARTLY)}
    assert not [g for g, c in graded[SOLVED].items() if any(o.output_type == "error" for o in c.get("outputs", []))]

    run_as(teacher, course, "nbgrader", "generate_feedback", lab)
    run_as(teacher, course, "nbgrader", "release_feedback", lab)
    for student, points in ((solved, all_points), (partly, partly_points)):
        run_as(student, student.home, "nbgrader", "fetch_feedback", lab)
        (feedback,) = (student.home / lab / "feedback").glob(f"*/{lab}.html")
        assert feedback.stat().st_uid == student.uid
        assert f"Score: {points:.1f} / {all_points:.1f}" in feedback.read_text(), student.name
