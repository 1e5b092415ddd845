"""The user's comparison: a notebook running nbrpc against the script it replaces.

    python benchmarks/user.py [--runs 5] [--calls 1000] [--trips 3] [--turns 60]
                              [--kind-turns 60] [--kind-calls 20] [--json FILE]

Four sides run the same code (``user_script.py``): a real Jupyter kernel (``%load_ext
nbrpc``, ``%rpc_init -n 1``, the script's functions as a cell), a plain script driving
nbrpc (``nbrpc.start(1)``), and the script with ``rpc.init_rpc`` between two plain
processes, told to use ``uv`` as nbrpc does (the ``..._uv`` rows, which carry the
targets: nbrpc's own cost on the same transport), and at torch's defaults as a user
writes it (``shm``, whose pollers spin a core per process: fastest on a quiet machine,
slowest where the cores are shared; nbrpc keeps ``uv`` for that). Whole runs take turns,
each side ``--runs`` times, the order reversed every other turn (the script on ``uv``
runs next to both nbrpc sides). A row's ratio is the median of the turns' ratios (each
nbrpc run against the init_rpc run of its turn), its values the medians of the runs; its
``spread`` is the init_rpc runs' own: the farthest of them from their median, as a
ratio. Every process starts in a session of its own, as a kernel does, so the scheduler
shares the CPU among them alike.

Whole runs of one side differ by up to 10% on a 2-core machine (the machine's drift and
load, and where the scheduler puts a run's threads). The ``user_*_beside_*`` rows take
them apart: a kernel and a script, each with a cluster of its own, and the script's
init_rpc pair on ``uv``, running at the same time and taking ``--turns`` turns of small
calls and ``remote`` + ``to_here``, give nbrpc's own share, and the kernel's; then the
argument-kind table (``user_<side>_beside_raw_<form>_<kind>``, ``--kind-turns`` turns of
``--kind-calls`` calls of each): an int, a small tensor, a 64 KiB tensor, a dict of two
tensors, a ``requires_grad`` tensor in a distributed autograd context, a keyword argument
and a cell class's instance, each by ``rpc_sync``, ``rpc_async`` + ``wait``, ``remote`` +
``to_here`` and a call through an RRef's proxy, with two controls that have no nbrpc in
them: a second init_rpc pair of the script, and its cells in a plain Jupyter kernel as
rank 0 of an init_rpc pair (what a kernel costs by itself).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
from results import TARGETS, row, write_rows
from usage import kill_pids

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "user_script.py"
# In a turn's order (every other turn reversed): the script on uv, which each nbrpc side
# is compared with, runs next to both.
SIDES = ("kernel", "raw_uv", "script", "raw")
FIGURES = {"sync": "sync_ms", "remote": "remote_ms", "throughput": "throughput", "tensor": "tensor_ms"}
TIMEOUT = 600


def cells(calls: int, trips: int) -> list[str]:
    """The notebook: what a user runs in place of the script."""
    text = SCRIPT.read_text()
    body = text.split("# -- cells begin\n", 1)[1].split("# -- cells end", 1)[0]
    return ["%load_ext nbrpc", "%rpc_init -n 1", body,
            f"import json\nprint(json.dumps(measure_all({calls}, {trips})))", "%rpc_shutdown"]


def run_kernel(calls: int, trips: int) -> dict:
    """One run in a real Jupyter kernel; its figures."""
    with tempfile.TemporaryDirectory(prefix="nbrpc-user-") as scratch:
        started, kernels = [], []
        try:
            km, kc = _kernel(scratch, "kernel", kernels)
            printed = []
            for cell in cells(calls, trips):
                started += _children(km.provisioner.pid)
                printed.append(_execute(kc, cell))
            return _last_json("".join(printed), "the kernel")
        finally:
            for km, kc in kernels:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            kill_pids(sorted(set(started)))


def _children(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _execute(kc, code: str) -> str:
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=TIMEOUT, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"the kernel failed on {code.splitlines()[0]!r}: "
                           f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    return "".join(out)


def run_script(calls: int, trips: int) -> dict:
    """One run of the script driving nbrpc."""
    done = subprocess.run([sys.executable, str(SCRIPT), "nbrpc", str(calls), str(trips)], capture_output=True,
                          text=True, timeout=TIMEOUT, start_new_session=True)
    return _last_json(done.stdout, "the script with nbrpc", done.stderr)


def run_raw(calls: int, trips: int, mode: str = "raw") -> dict:
    """One run of the script as two plain processes joined by ``init_rpc`` (``mode``
    "raw-uv": told to use the ``uv`` transport only)."""
    with tempfile.TemporaryDirectory(prefix="nbrpc-user-") as scratch:
        store = str(Path(scratch) / "store")
        procs = [subprocess.Popen([sys.executable, str(SCRIPT), mode, str(rank), store, str(calls), str(trips)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) for rank in (0, 1)]
        try:
            out, err = procs[0].communicate(timeout=TIMEOUT)
            procs[1].communicate(timeout=60)
        finally:
            kill_pids([p.pid for p in procs if p.poll() is None])
    return _last_json(out, f"the script with init_rpc ({mode})", err)


def _last_json(stdout: str, who: str, stderr: str = "") -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{who} printed no figures:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return json.loads(lines[-1])


def take_turns(runs: int, calls: int, trips: int, progress=print) -> dict[str, list[dict]]:
    """Whole runs of each side in turns, the order reversed every other turn."""
    run = {"kernel": run_kernel, "script": run_script, "raw": run_raw,
           "raw_uv": lambda c, t: run_raw(c, t, "raw-uv")}
    found = {side: [] for side in SIDES}
    for turn in range(runs):
        for side in SIDES[::-1] if turn % 2 else SIDES:
            progress(f"user's comparison: {side}, run {turn + 1} of {runs}")
            found[side].append(run[side](calls, trips))
    return found


# The sides that run at once in ``side_by_side``, and its rows: (side, reference, figure).
BESIDE = ("kernel", "script", "raw_uv")
# The argument-kind table's sides: besides, two controls with no nbrpc in them: a second
# init_rpc pair of the same script, which reads how far a row strays from 1.00, and the
# script's cells in a plain Jupyter kernel under init_rpc, which reads what a kernel costs.
KIND_SIDES = BESIDE + ("raw_uv_again", "raw_kernel")
# The argument-kind table's row groups: (side in the row ids, side measured).
KIND_ROWS = (("kernel", "kernel"), ("script", "script"), ("control", "raw_uv_again"), ("plainkernel", "raw_kernel"))
# The argument-kind table's columns and rows (``user_script.kinds_turn``): forms of call, kinds of argument.
FORMS = ("sync", "async", "remote", "proxy")
ARGUMENT_KINDS = ("int", "tensor", "tensor64k", "dict", "grad", "kwargs", "instance")
BESIDE_ROWS = {"user_kernel_beside_script_sync": ("kernel", "script", "sync_ms"),
               "user_kernel_beside_raw_sync": ("kernel", "raw_uv", "sync_ms"),
               "user_kernel_beside_raw_remote": ("kernel", "raw_uv", "remote_ms"),
               "user_kernel_beside_raw_throughput": ("kernel", "raw_uv", "throughput"),
               "user_script_beside_raw_sync": ("script", "raw_uv", "sync_ms"),
               "user_script_beside_raw_remote": ("script", "raw_uv", "remote_ms"),
               "user_script_beside_raw_throughput": ("script", "raw_uv", "throughput")}


def side_by_side(turns: int = 60, calls: int = 200, kind_turns: int = 60, kind_calls: int = 20) -> dict:
    """A kernel and a script, each driving a cluster of its own, and the script's
    ``init_rpc`` pair (on ``uv``), all running at once, take ``turns`` turns of ``calls``
    small calls, half as many ``remote`` + ``to_here`` and ``calls`` ``rpc_async`` with 32
    in flight (the order rotating), so that the machine's drift, its load and a run's
    thread placement fall on every side alike; then ``kind_turns`` turns of the
    argument-kind table, the sides taking turns row by row, ``kind_calls`` calls of each
    form and kind, with the controls (``KIND_SIDES``): a second init_rpc pair of the
    script, and a plain Jupyter kernel (no nbrpc) as rank 0 of an init_rpc pair, whose
    cells are the script's. Each side's figures per turn (``user_script.turn``,
    ``user_script.kinds_turn``)."""
    with tempfile.TemporaryDirectory(prefix="nbrpc-user-") as scratch:
        store, again, plain = (str(Path(scratch) / name) for name in ("store", "store-again", "store-plain"))
        commands = ([sys.executable, str(SCRIPT), "nbrpc", "--turns"],
                    [sys.executable, str(SCRIPT), "raw-uv", "0", store, "--turns"],
                    [sys.executable, str(SCRIPT), "raw-uv", "0", again, "--turns"],
                    [sys.executable, str(SCRIPT), "raw-uv", "1", store],
                    [sys.executable, str(SCRIPT), "raw-uv", "1", again],
                    [sys.executable, str(SCRIPT), "raw-uv", "1", plain])
        errors = [Path(scratch) / f"stderr-{i}" for i in range(len(commands))]
        procs, started, kernels = [], [], []
        try:
            for command, err in zip(commands, errors):
                with err.open("w") as sink:
                    procs.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=sink, text=True, start_new_session=True))
            km, kc = _kernel(scratch, "kernel", kernels)
            for cell in cells(0, 0)[:3]:
                started += _children(km.provisioner.pid)
                _execute(kc, cell)
            _, plain_kc = _kernel(scratch, "plain-kernel", kernels)
            for cell in (cells(0, 0)[2], PLAIN_KERNEL_JOINS.format(store=plain)):
                _execute(plain_kc, cell)
            ask = {"kernel": _asking_kernel(kc, "the kernel"),
                   "script": _asking(procs[0], "the script with nbrpc", errors[0]),
                   "raw_uv": _asking(procs[1], "the script with init_rpc (raw-uv)", errors[1]),
                   "raw_uv_again": _asking(procs[2], "the control's script with init_rpc (raw-uv)", errors[2]),
                   "raw_kernel": _asking_kernel(plain_kc, "the plain kernel with init_rpc (raw-uv)")}
            for side in KIND_SIDES:
                ask[side](calls)  # connections and threads: not timed
            found = _rotating(ask, BESIDE, turns, calls)
            kinds = _rotating_rows(ask, KIND_SIDES, kind_turns, kind_calls)
            _execute(kc, "%rpc_shutdown")
            _execute(plain_kc, "rpc.shutdown()")
        finally:
            for proc in procs:
                started += _children(proc.pid)
                if proc.stdin:
                    proc.stdin.close()
            for proc in procs:
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    pass
                proc.stdout.close()
            for km, kc in kernels:
                kc.stop_channels()
                km.shutdown_kernel(now=True)
            kill_pids(sorted(set(started + [proc.pid for proc in procs])))
    return {"turns": found, "calls": calls, "kinds": kinds, "kind_calls": kind_calls}


# The plain kernel's second cell: rank 0 of an init_rpc pair on uv, as the script's ``main`` joins.
PLAIN_KERNEL_JOINS = """options = rpc.TensorPipeRpcBackendOptions(init_method="file://{store}", _transports=["uv"])
rpc.init_rpc("master", rank=0, world_size=2, rpc_backend_options=options)"""


def _kernel(scratch: str, name: str, kernels: list) -> tuple:
    """A Jupyter kernel in ``scratch`` and its ready client, noted in ``kernels`` (for the
    caller to end). It talks over Unix sockets: TCP ports chosen before the kernel binds
    them can be taken by others meanwhile."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(scratch) / name))
    km.start_kernel(cwd=scratch)
    kc = km.client()
    kernels.append((km, kc))
    kc.start_channels()
    kc.wait_for_ready(timeout=TIMEOUT)
    return km, kc


def _asking_kernel(kc, who: str):
    """A turn of ``calls`` (N, or "kinds N ROW") run as a cell of the kernel ``kc``."""
    return lambda n: _last_json(_execute(kc, f"import json\nprint(json.dumps({_turn_call(n)}))"), who)


def _turn_call(n: int | str) -> str:
    """The kernel's call for a turn asked as the scripts are (``n``: N, or "kinds N ROW")."""
    words = str(n).split()
    return f"kinds_turn({words[1]}, {words[2]!r})" if words[0] == "kinds" else f"turn({words[0]})"


def _rotating(ask: dict, sides: tuple[str, ...], turns: int, calls: int | str) -> dict[str, list[dict]]:
    """``turns`` turns of every one of ``sides``, the order rotating; each side's figures."""
    found = {side: [] for side in sides}
    for i in range(turns):
        for side in _from(sides, i):
            found[side].append(ask[side](calls))
    return found


def _from(sides: tuple[str, ...], i: int) -> tuple[str, ...]:
    """``sides`` in turn order, the ``i``-th (wrapping around) first."""
    first = i % len(sides)
    return sides[first:] + sides[:first]


def _rotating_rows(ask: dict, sides: tuple[str, ...], turns: int, calls: int) -> dict[str, list[dict]]:
    """``turns`` turns of the argument-kind table, every side taking each row in turn (the
    order rotating), so that a row's figures from all sides are measured within a fraction
    of a second of each other: what the machine does meanwhile falls on all of them alike.
    Each side's figures per turn, every row's."""
    found = {side: [] for side in sides}
    for i in range(turns):
        figures = {side: {} for side in sides}
        for j, figure in enumerate(f"{form}_{kind}" for form in FORMS for kind in ARGUMENT_KINDS):
            for side in _from(sides, i + j):
                figures[side].update(ask[side](f"kinds {calls} {figure}"))
        for side in sides:
            found[side].append(figures[side])
    return found


def _asking(proc: subprocess.Popen, who: str, stderr: Path):
    """A turn of ``calls`` from a process that measures a turn per line of its input."""

    def ask(calls: int) -> dict:
        proc.stdin.write(f"{calls}\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        return _last_json(line, who, "" if line else stderr.read_text())

    return ask


def beside_rows(found: dict) -> list[dict]:
    """Each ``BESIDE_ROWS`` row: the median of the turns' ratios."""
    rows = []
    for row_id, (side, reference, figure) in BESIDE_ROWS.items():
        ours, theirs = ([turn[figure] for turn in found["turns"][s]] for s in (side, reference))
        calls = found["calls"] // 2 if figure == "remote_ms" else found["calls"]
        rows.append(row(row_id, statistics.median(ours), statistics.median(theirs),
                        ratio=statistics.median(TARGETS[row_id].ratio(o, t) for o, t in zip(ours, theirs)),
                        note=f"median of {len(ours)} turns' ratios, {calls} calls a turn, "
                             "the sides running at once, in turns"))
    return rows


def kind_rows(found: dict) -> list[dict]:
    """``user_<side>_beside_raw_<form>_<kind>``: each form and kind of argument from the
    kernel, the script and the controls (``KIND_ROWS``) against the init_rpc pair, the
    median of the turns' ratios."""
    rows = []
    for side, measured in KIND_ROWS:
        for form in FORMS:
            for kind in ARGUMENT_KINDS:
                row_id, figure = f"user_{side}_beside_raw_{form}_{kind}", f"{form}_{kind}"
                ours, theirs = ([turn[figure] for turn in found["kinds"][s]] for s in (measured, "raw_uv"))
                rows.append(row(row_id, statistics.median(ours), statistics.median(theirs),
                                ratio=statistics.median(TARGETS[row_id].ratio(o, t) for o, t in zip(ours, theirs)),
                                note=f"median of {len(ours)} turns' ratios, {found['kind_calls']} calls a turn, "
                                     "the sides running at once, in turns"))
    return rows


def user_rows(found: dict[str, list[dict]]) -> list[dict]:
    """Each nbrpc side against the script at torch's defaults (``user_<side>_<figure>``),
    and its small calls against the script told to use ``uv`` (``..._uv``). A row's ratio
    is the median of the turns' ratios, each run against the reference's run of the same
    turn, as the in-run rows pair their rounds: the machine's drift over minutes falls on
    both runs of a turn alike. The note gives the runs and the ratio of their medians."""
    pairs = [(side, name, "raw", "") for side in ("kernel", "script") for name in FIGURES]
    pairs += [(side, name, "raw_uv", "_uv") for side in ("kernel", "script") for name in FIGURES if name != "tensor"]
    rows = []
    for side, name, reference, suffix in pairs:
        if not found.get(reference):
            continue
        ours, raw = ([run[FIGURES[name]] for run in found[s]] for s in (side, reference))
        target = TARGETS[f"user_{side}_{name}{suffix}"]
        middle = statistics.median(raw)
        spread = max((max(r / middle, middle / r) for r in raw), default=None)
        of_medians = target.ratio(statistics.median(ours), middle)
        rows.append(row(f"user_{side}_{name}{suffix}", statistics.median(ours), middle, spread=spread,
                        ratio=statistics.median(target.ratio(o, r) for o, r in zip(ours, raw)),
                        note=f"median of {len(ours)} turns' ratios (of the medians: {of_medians:.3f}); runs: "
                             f"{', '.join(f'{x:.4g}' for x in ours)} against {', '.join(f'{x:.4g}' for x in raw)}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="whole runs of each side")
    parser.add_argument("--calls", type=int, default=1000, help="small calls a run (remote: half)")
    parser.add_argument("--trips", type=int, default=3, help="100 MiB round trips a run")
    parser.add_argument("--turns", type=int, default=60, help="turns of the sides running side by side")
    parser.add_argument("--kind-turns", type=int, default=60, help="turns of the argument-kind table")
    parser.add_argument("--kind-calls", type=int, default=20, help="calls of each form and kind a turn")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    def progress(message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)

    found = take_turns(args.runs, args.calls, args.trips, progress)
    rows = user_rows(found)
    progress("user's comparison: a kernel, a script and the init_rpc pair side by side")
    found = side_by_side(args.turns, kind_turns=args.kind_turns, kind_calls=args.kind_calls)
    rows += beside_rows(found) + kind_rows(found)
    for r in rows:
        print(f"{r['id']:<40} {r['nbrpc']:>10.4g} {r['reference']:>10.4g} {r['ratio']:>6.2f}  {r['target']}")
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
