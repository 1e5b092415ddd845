"""Shared fixtures and helpers: one real cluster per module, IPython's shell, polling,
process bookkeeping, and a check that no worker survives."""

from __future__ import annotations

import contextlib
import itertools
import json
import keyword
import os
import queue
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from unix_socket_kernels import UnixSocketKernelManager

import nbrpc
from nbrpc._util import kill_pids, pid_alive, start_time, unused_loopback_port

# Every process this test run starts inherits the mark (workers, driver scripts,
# kernels and their workers), so concurrent runs never count or end each other's.
RUN_MARK = "NBRPC_TEST_RUN"
os.environ[RUN_MARK] = f"{os.getpid()}-{time.time_ns()}"


def find_processes(command: str, environ: str | None = None) -> set[int]:
    """Pids of live processes whose command line (its words joined by spaces) contains
    ``command`` and, if given, whose environment has the entry ``environ`` ("NAME=VALUE",
    or "NAME=" for any value)."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        try:
            if command not in " ".join(process.info["cmdline"] or ()):
                continue
            if environ is not None:
                name, _, value = environ.partition("=")
                have = process.environ().get(name)
                if have is None or (value and have != value):
                    continue
            if pid_alive(process.pid):
                found.add(process.pid)
        except psutil.Error:  # ended meanwhile, or not ours to read
            pass
    return found


def worker_pids() -> set[int]:
    """Pids of every live nbrpc worker kernel started by this test run."""
    return find_processes("nbrpc.member.worker", f"{RUN_MARK}={os.environ[RUN_MARK]}")


def kernel_pids() -> set[int]:
    """Pids of every live notebook kernel (ipykernel_launcher) started by this test run."""
    return find_processes("ipykernel_launcher", f"{RUN_MARK}={os.environ[RUN_MARK]}")


def free_port() -> int:
    """A loopback port nobody listens on, where no socket bound to port 0 takes it first."""
    return unused_loopback_port()


def wait_until(check, timeout: float = 10.0, interval: float = 0.05):
    """Call ``check()`` until it returns something true or ``timeout`` s have passed;
    return its last value (assert on it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_gone(pids, timeout: float = 10.0) -> set[int]:
    """Wait until ``pids`` have ended; return those still alive after ``timeout``."""
    pids = set(pids)

    def alive() -> set[int]:
        return {p for p in pids if pid_alive(p)}

    wait_until(lambda: not alive(), timeout)
    return alive()


def run(shell, code: str):
    """Run ``code`` as a cell; raise what it raised, return its last expression's value."""
    result = shell.run_cell(code, store_history=False)
    result.raise_error()
    return result.result


@contextlib.contextmanager
def unix_socket_kernel():
    """A kernel manager (not started) whose kernel listens on Unix sockets in a folder of its
    own (``unix_socket_kernels``), removed at the end, started or not."""
    km = UnixSocketKernelManager(kernel_name="python3")
    try:
        yield km
    finally:
        km.remove_sockets_folder()


def execute_cells(folder, sources, timeout: float = 240, allow_errors: bool = False):
    """Run ``sources`` as the cells of a fresh notebook kernel (nbclient); return the
    executed notebook. A cell that raises fails here, naming its index, source and error
    (unless ``allow_errors``)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    with unix_socket_kernel() as km:
        client = NotebookClient(notebook, km=km, timeout=timeout, kernel_name="python3",
                                allow_errors=allow_errors, resources={"metadata": {"path": str(folder)}})
        try:
            client.execute()
        except CellExecutionError as e:
            failed = next((i for i, cell in enumerate(notebook.cells)
                           if any(o.output_type == "error" for o in cell.get("outputs", ()))), None)
            pytest.fail(f"cell {failed} failed:\n{sources[failed] if failed is not None else ''}\n{e}",
                        pytrace=False)
        finally:  # a kernel manager passed in is the caller's to end, with its client
            if client.kc is not None:
                client.kc.stop_channels()
            if km.has_kernel:
                km.shutdown_kernel(now=True)
    return notebook


def cell_text(cell, kind: str = "stream") -> str:
    """What a cell printed (``stream``), or its result's text (``execute_result``)."""
    if kind == "execute_result":
        return "".join(o.data.get("text/plain", "") for o in cell.outputs if o.output_type == kind)
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == kind)


def execute(client, code: str, timeout: float = 120, **kwargs):
    """Run ``code`` in the kernel; return (iopub messages of this request, reply)."""
    msg_id = client.execute(code, **kwargs)
    deadline = time.monotonic() + timeout
    messages = []
    while True:
        msg = client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        messages.append(msg)
    while True:
        reply = client.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return messages, reply["content"]


def streamed(messages, name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for m in messages
                   if m["msg_type"] == "stream" and m["content"]["name"] == name)


@contextlib.contextmanager
def as_main(shell):
    """The shell's namespace is ``__main__`` inside, as in a kernel (IPython's test
    app puts pytest's back)."""
    saved, sys.modules["__main__"] = sys.modules["__main__"], shell.user_module
    try:
        yield shell
    finally:
        sys.modules["__main__"] = saved


# Where a test runs in CI (make test): the files below are marked here, in one place, by
# the node id's start (a file, or a file's class). ``serial`` tests run in a pytest call
# of their own, one at a time; the rest run three at once (pytest-xdist, --dist loadfile:
# a module's tests, and its shared cluster, stay in one process; see xdist_scope). A
# file that starts its own processes, leaves a listening port to the kernel (port 0) and
# keeps to its tmp_path can run beside another: each xdist process marks the processes
# it starts (RUN_MARK), so the leak check never counts another's.
SERIAL = {
    # How soon something happens: a finding within 3 s, a timeout at its time, a stop
    # that ends the call at once, a worker noticing its driver's death, a fork's speed.
    "test_attach.py", "test_calls.py", "test_errors.py", "test_lifecycle.py", "test_serving.py",
    "test_timeouts.py", "test_tracing.py", "test_template.py", "test_panel_server.py",
    "test_differential.py",  # its timeouts, compared with raw torch's within 0.15 s
    "test_waits.py", "test_waits_attach.py", "test_waits_futures.py", "test_waits_kernel.py",
    "test_waits_view.py", "test_labs.py::TestHangsMistakes",
    # Debuggers stopping and resuming threads on cue, waited for with deadlines.
    "test_worker_pdb.py", "test_lab_debugger.py",
    # A browser and a Jupyter server per test, with timings of their own.
    "test_browser.py", "test_panel_browser.py", "test_views.py", "test_debugger_browser.py",
}
# Serial files about the machine as a whole (every worker kernel of this user counted,
# stale scratch folders swept): they run with nothing beside them, where the other
# serial files have the notebooks beside them at a lower priority (Makefile, test).
MACHINE_WIDE = {"test_limits.py", "test_scratch.py"}
SERIAL |= MACHINE_WIDE
# Files that use shared parts of the machine but assert no timing, by kind: real local
# users with fixed names and a hub (batchspawner's with a Slurm of its own); network
# namespaces (named by pid, so two kinds never meet). They run beside the other files, one
# at a time among their kind (one xdist scope a kind). test_slurm.py's Slurm is its own
# (tests/minislurm.py: its folder, munge socket and ports), and runs as root: beside anything.
ONE_AT_A_TIME = {
    "users and daemons": {"test_hub.py", "test_hub_panel.py", "test_exchange.py", "test_batchspawner.py",
                          "test_private_network.py"},
    "namespaces": {"test_netns.py", "test_lab_debugger_hosts.py"},
}
ONE_AT_A_TIME_FILES = set().union(*ONE_AT_A_TIME.values())
# Files that assert no timing and share nothing with other files, long and CPU-bound, which
# run beside the serial tests at the idle priority (Makefile: test-beside) rather than in
# the parallel tier: that tier keeps both cores busy to its end, while the serial tests
# mostly wait and leave over a core idle.
BESIDE = {"test_docs.py", "test_upstream.py"}
# What can differ under another torch release (make test-newest runs these under the
# newest one): the compat layer and every private name it reads, the call path (kinds of
# callables, pickling, shared tensors, error classes, timeouts), torch's own examples
# and tests through nbrpc, joining a group as init_rpc does, and the differential check.
TORCH_VERSION = {
    "test_compat.py", "test_call_kinds.py", "test_calls.py", "test_serialization.py",
    "test_shared_tensors.py", "test_fidelity.py", "test_errors.py", "test_timeouts.py",
    "test_upstream.py", "test_membership.py", "test_conformance.py", "test_differential.py",
    # Snapshots built from torch's private structures (RRef forks, autograd graphs).
    "test_rrefs.py", "test_autograd.py",
}


TESTS = Path(__file__).resolve().parent
TIERS_BY_FILE = (("serial", SERIAL), ("machine_wide", MACHINE_WIDE), ("beside", BESIDE),
                 ("torch_version", TORCH_VERSION))


def _listed(item, names: set[str]) -> bool:
    """Whether ``item``'s node id (below tests/) starts with one of ``names``."""
    nodeid = item.nodeid.removeprefix("tests/")
    return any(nodeid == name or nodeid.startswith(name + "::") or nodeid.startswith(name + "/")
               for name in names)


def pytest_ignore_collect(collection_path, config):
    """Leave out a test file none of whose tests the ``-m`` expression can select, told by
    the tiers above where they name the whole file, rather than import it to deselect them
    all: every pytest run of ``make test`` imported all the files (about 14 s of CPU)."""
    expression = config.option.markexpr
    name = collection_path.name
    if (not expression or collection_path.parent != TESTS or not name.startswith("test_")
            or collection_path.suffix != ".py" or not re.fullmatch(r"[\w\s()]+", expression)):
        return None
    known = {marker: name in names for marker, names in TIERS_BY_FILE
             if not any(entry.startswith(name + "::") for entry in names)}
    unknown = sorted(set(re.findall(r"\w+", expression)) - {"and", "or", "not"} - set(known))
    if any(not word.isidentifier() or keyword.iskeyword(word) for word in unknown):
        return None
    try:
        for values in itertools.product((False, True), repeat=len(unknown)):
            if eval(expression, {"__builtins__": {}}, {**known, **dict(zip(unknown, values))}):
                return None
    except SyntaxError:  # (not an expression pytest takes: it says why)
        return None
    return True


def pytest_configure(config):
    """The stop button (SIGINT) works here and in the processes the tests start, as in a
    kernel: a shell starts a background job with SIGINT ignored, and Python leaves it so."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The longest units of the parallel tiers, longest first (their seconds in a CI run), handed
# out first so that a tier does not end on one of them with the other processes idle: xdist
# orders units by test count, which left a minute-long file of three tests last.
LONGEST_FIRST = ("tests/test_nbgrader.py", "users and daemons", "tests/test_slurm.py", "tests/test_upstream.py",
                 "namespaces", "tests/test_conformance.py", "tests/test_benchmarks.py",
                 "tests/test_torch_threads.py", "tests/test_advice.py", "tests/test_labs.py",
                 "tests/test_group.py", "tests/test_shared_tensors.py", "tests/test_install.py")


def xdist_scope(nodeid: str) -> str:
    """The unit xdist hands one process: a test's file, or all the ONE_AT_A_TIME files of a kind."""
    file = nodeid.split("::")[0].removeprefix("tests/")
    return next((kind for kind, files in ONE_AT_A_TIME.items() if file in files), nodeid.split("::")[0])


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the ONE_AT_A_TIME files of a kind as one file (xdist's loadgroup
    marks do not reach its scheduler under pytest 9), the LONGEST_FIRST units first."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndKind(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            for scope in reversed(LONGEST_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ByFileAndKind(config, log)


def pytest_collection_modifyitems(config, items):
    """Mark the ``serial``, ``machine_wide``, ``beside`` and ``torch_version`` tests (the lists
    above); tests marked ``gpu`` skip where torch sees no CUDA (``-ra`` prints why)."""
    for item in items:
        for marker, names in TIERS_BY_FILE:
            if _listed(item, names):
                item.add_marker(marker)
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="gpu: CUDA is not available here (torch.cuda.is_available() is "
                                   "False); run on a machine with a GPU and a CUDA build of torch")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def no_leftover_workers():
    """Fail the module if it leaves a worker process behind (and end it by pid)."""
    before = worker_pids()
    yield
    survivors = wait_gone(worker_pids() - before)
    kill_pids(sorted(survivors))
    assert not survivors, f"worker processes survived the tests: {sorted(survivors)}"


@pytest.fixture(scope="module")
def ip():
    """IPython's test shell (a terminal, not a kernel) with nbrpc's extension loaded."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "nbrpc")
    return shell


@pytest.fixture(scope="module")
def shell(ip, cluster):
    """The IPython shell as a kernel's ``__main__``, with torch and RPC imported, and the
    module's cluster running."""
    with as_main(ip):
        run(ip, "import os, threading, time\nimport torch\nimport torch.nn as nn\n"
                "import torch.distributed.rpc as rpc")
        yield ip


@pytest.fixture(scope="module")
def cluster():
    """A running driver + worker1, worker2 cluster shared by a test module."""
    c = nbrpc.start(2, progress=None, timeout=30)
    pids = [w.pid for w in c.workers]
    yield c
    c.shutdown()
    assert not wait_gone(pids), "shutdown left worker processes running"


class Pids:
    """Processes a test started (and their descendants), by pid and start time."""

    def __init__(self):
        self.known: dict[int, float | None] = {}

    def add(self, *pids: int) -> None:
        for pid in pids:
            if pid not in self.known:
                self.known[pid] = start_time(pid)

    def add_tree(self, pid: int) -> None:
        """``pid`` and every process below it, as they are now."""
        self.add(pid)
        for child in children(pid):
            self.add_tree(child)

    def alive(self) -> list[int]:
        return [p for p, t in self.known.items() if pid_alive(p) and start_time(p) == t]

    def end(self) -> list[int]:
        for pid in list(self.known):
            if pid_alive(pid) and start_time(pid) == self.known[pid]:
                self.add_tree(pid)
        kill_pids(self.alive())
        return self.alive()


def children(pid: int) -> list[int]:
    """Pids of the processes ``pid`` started that still run (its direct children)."""
    try:
        return [p.pid for p in psutil.Process(pid).children()]
    except psutil.Error:
        return []


# How long a driver script in a subprocess may take to start its cluster (loaded machine).
DRIVER_START = 120.0


class Driver:
    """A driver script in a subprocess; its stdout is read as JSON lines."""

    def __init__(self, source: str, folder, pids: Pids, user=None):
        """``user``: run as that local user (``users.LocalUser``), in its home, not ``folder``."""
        folder = user.home if user is not None else folder
        label = "driver" if not (folder / "driver.py").exists() else f"driver-{time.time_ns()}"
        script = folder / f"{label}.py"
        script.write_text(textwrap.dedent(source))
        self.stderr_path = folder / f"{label}.err"
        as_user = {} if user is None else user.popen_options()
        if user is not None:
            os.chown(script, user.uid, user.gid)
        with open(self.stderr_path, "wb") as err:
            python = [*as_user.pop("prefix", []), as_user.pop("executable", sys.executable)]
            self.proc = subprocess.Popen(
                [*python, str(script)], stdout=subprocess.PIPE, stderr=err,
                cwd=folder, start_new_session=True, text=True, **as_user,
            )
        pids.add(self.proc.pid)
        self.pids = pids
        self.lines: queue.Queue = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def close(self) -> None:
        """End the driver if it still runs, and release its pipe."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        self.proc.stdout.close()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, key: str, timeout: float) -> dict:
        """The next JSON line that has ``key``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                line = ""
            if line is None or (not line and time.monotonic() >= deadline):
                pytest.fail(f"driver printed no {key!r} (exit {self.proc.poll()}); "
                            f"its stderr:\n{self.stderr_path.read_text()[-3000:]}")
            if line and line.startswith("{"):
                record = json.loads(line)
                if key in record:
                    return record

    def worker_pids(self) -> list[int]:
        workers = self.expect("pids", DRIVER_START)["pids"]
        self.pids.add(*workers)
        assert len(workers) == 2 and all(pid_alive(p) for p in workers)
        return workers


@pytest.fixture(scope="module")
def traced():
    """Driver + worker1, worker2, recording every call from the start (trace=True)."""
    if nbrpc.current() is not None:
        pytest.skip("another cluster is running in this process")
    c = nbrpc.start(2, progress=None, timeout=30, trace=True)
    pids = [w.pid for w in c.workers]
    yield c
    c.shutdown()
    assert not wait_gone(pids), "shutdown left worker processes running"


@pytest.fixture
def kernel(pids, tmp_path):
    """A real ipykernel (the notebook's kernel) in ``tmp_path``: its manager and a ready
    client; ended, and checked gone, at the end."""
    with unix_socket_kernel() as km:
        km.start_kernel(cwd=str(tmp_path))
        pids.add(km.provisioner.pid)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=120)
            yield km, kc
        finally:
            kc.stop_channels()
            pid = km.provisioner.pid if km.has_kernel else None
            if km.has_kernel:
                km.shutdown_kernel(now=True)
            km.cleanup_resources()
            assert pid is None or not wait_gone([pid], timeout=5)


@pytest.fixture
def drivers(tmp_path, pids):
    """Factory: ``drivers(source)`` runs a driver script; each is ended at the end."""
    started: list[Driver] = []

    def start(source: str, user=None) -> Driver:
        started.append(Driver(source, tmp_path, pids, user))
        return started[-1]

    yield start
    for driver in started:
        driver.close()


@pytest.fixture
def student():
    """A real second local user (``users.LocalUser``) with a fresh home."""
    yield from _local_user("nbrpc-student1")


@pytest.fixture
def classmate():
    """Another real local user, beside ``student``."""
    yield from _local_user("nbrpc-student2")


def _local_user(name: str):
    from users import LocalUser, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    user = LocalUser.make(name)
    yield user
    user.remove_home()


@pytest.fixture
def pids():
    """Processes a test registers; ended by pid after it, and none may survive."""
    tracked = Pids()
    yield tracked
    survivors = tracked.end()
    assert not survivors, f"processes survived the test: {survivors}"


@pytest.fixture
def stop_button():
    """``press(after)``: SIGINT to this process (the stop button) while the main thread waits."""
    timers = []

    def press(after: float) -> None:
        timers.append(threading.Timer(after, os.kill, args=(os.getpid(), signal.SIGINT)))
        timers[-1].start()

    yield press
    for timer in timers:
        timer.cancel()


def optimizer_steps_sent() -> list[str]:
    """The step functions the installed torch's ``DistributedOptimizer.step`` sends, read
    from its code: every module-level function of its module whose name says it is one."""
    from torch.distributed.optim import DistributedOptimizer, optimizer

    names = DistributedOptimizer.step.__code__.co_names
    return [n for n in names if n.endswith("_local_optimizer_step") and callable(getattr(optimizer, n, None))]


class Cell:
    """A cell running in a thread, as the notebook's stuck cell: its error or value."""

    def __init__(self, shell, code: str):
        self.error = self.value = None
        self.thread = threading.Thread(target=self._run, args=(shell, code), daemon=True)
        self.thread.start()

    def _run(self, shell, code: str) -> None:
        try:
            self.value = run(shell, code)
        except BaseException as e:  # the test asserts on it
            self.error = e

    def join(self, timeout: float = 60.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the staged hang did not end"


def finding(kind: str, within: float = 3.0) -> tuple[dict | None, float, dict]:
    """Wait for a finding of ``kind``; (the finding, seconds it took, the snapshot)."""
    began = time.monotonic()
    last = {}

    def found():
        last.update(nbrpc.waits())
        return next((f for f in last["findings"] if f["kind"] == kind), None)

    result = wait_until(found, within, interval=0.2)
    return result, time.monotonic() - began, last


# The nested-lock deadlock, as a notebook cell: outer holds the lock while its call back into
# worker1 waits for it (needs threading and rpc in the namespace).
LOCK_CELL = """\
lock = threading.Lock()
def inner():
    with lock:
        return 1
def outer():
    with lock:
        return rpc.rpc_sync("worker1", inner)
rpc.rpc_sync("worker1", outer)
"""
