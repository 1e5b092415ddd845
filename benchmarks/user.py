"""The user's comparison: a notebook running nbrpc against the script it replaces.

    python benchmarks/user.py [--runs 5] [--calls 1000] [--trips 3] [--turns 30] [--json FILE]

Four sides run the same code (``user_script.py``): a real Jupyter kernel (``%load_ext
nbrpc``, ``%rpc_init -n 1``, the script's functions as a cell), a plain script driving
nbrpc (``nbrpc.start(1)``), and the script with ``rpc.init_rpc`` between two plain
processes, told to use ``uv`` as nbrpc does (the ``..._uv`` rows, which carry the
targets: nbrpc's own cost on the same transport), and at torch's defaults as a user
writes it (``shm``, whose pollers spin a core per process: fastest on a quiet machine,
slowest where the cores are shared; nbrpc keeps ``uv`` for that). Whole runs take turns (the order rotating), each
side ``--runs`` times, and each row compares the median of a side's runs with the
median of the init_rpc runs. A row's ``spread`` is the init_rpc runs' own: the farthest
of them from their median, as a ratio. Every process starts in a session of its own,
as a kernel does, so the scheduler shares the CPU among them alike.

Whole runs of one side differ by up to 10% on a 2-core machine (the machine's drift, and
where the scheduler puts a run's threads). The ``user_kernel_beside_script_sync`` row
takes them apart: a kernel and a script, each with a cluster of its own, running at the
same time and taking ``--turns`` turns of small calls, give the kernel's own share.
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
from results import row, write_rows
from usage import kill_pids

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "user_script.py"
SIDES = ("kernel", "script", "raw", "raw_uv")
FIGURES = {"sync": "sync_ms", "remote": "remote_ms", "throughput": "throughput", "tensor": "tensor_ms"}
TIMEOUT = 600


def cells(calls: int, trips: int) -> list[str]:
    """The notebook: what a user runs in place of the script."""
    text = SCRIPT.read_text()
    body = text.split("# -- cells begin\n", 1)[1].split("# -- cells end", 1)[0]
    return ["%load_ext nbrpc", "%rpc_init -n 1", body,
            f"import json\nprint(json.dumps(measure_all({calls}, {trips})))", "%rpc_shutdown"]


def run_kernel(calls: int, trips: int) -> dict:
    """One run in a real Jupyter kernel; its figures. The kernel talks over Unix sockets:
    TCP ports chosen before the kernel binds them can be taken by others meanwhile."""
    from jupyter_client import KernelManager

    with tempfile.TemporaryDirectory(prefix="nbrpc-user-") as scratch:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(scratch) / "kernel"))
        km.start_kernel(cwd=scratch)
        started = []
        try:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=TIMEOUT)
            printed = []
            for cell in cells(calls, trips):
                started += _children(km.provisioner.pid)
                printed.append(_execute(kc, cell))
            kc.stop_channels()
            return _last_json("".join(printed), "the kernel")
        finally:
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
    """Whole runs of each side in turns, the order rotating."""
    run = {"kernel": run_kernel, "script": run_script, "raw": run_raw,
           "raw_uv": lambda c, t: run_raw(c, t, "raw-uv")}
    found = {side: [] for side in SIDES}
    for turn in range(runs):
        for side in SIDES[turn % len(SIDES):] + SIDES[:turn % len(SIDES)]:
            progress(f"user's comparison: {side}, run {turn + 1} of {runs}")
            found[side].append(run[side](calls, trips))
    return found


def kernel_beside_script(turns: int = 30, calls: int = 200) -> dict:
    """The kernel's own share: a kernel and a script, each driving a cluster of its own at
    the same time, take turns of ``calls`` small calls (the order alternating), so that
    the machine's drift and a run's thread placement fall on both alike. The medians of
    the turns' medians (ms) and of their ratios."""
    from jupyter_client import KernelManager

    loop = SCRIPT.read_text().split("# -- cells begin\n", 1)[1].split("# -- cells end", 1)[0]
    turn = loop + "\nturn = lambda n: timed(lambda: rpc.rpc_sync('worker1', echo, args=(1,)), n)\n"
    script = ("import sys\nimport nbrpc\n" + turn + "cluster = nbrpc.start(1, progress=None)\ntry:\n"
              "    for line in sys.stdin:\n        print(turn(int(line)), flush=True)\n"
              "finally:\n    cluster.shutdown()\n")
    with tempfile.TemporaryDirectory(prefix="nbrpc-user-") as scratch:
        km = KernelManager(kernel_name="python3", transport="ipc", ip=str(Path(scratch) / "kernel"))
        km.start_kernel(cwd=scratch)
        started = []
        proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=TIMEOUT)
            for cell in ("%load_ext nbrpc", "%rpc_init -n 1", turn):
                started += _children(km.provisioner.pid)
                _execute(kc, cell)

            def in_kernel(n: int) -> float:
                return float(_execute(kc, f"print(turn({n}))").split()[-1])

            def in_script(n: int) -> float:
                proc.stdin.write(f"{n}\n")
                proc.stdin.flush()
                return float(proc.stdout.readline())

            in_kernel(calls)
            in_script(calls)  # connections and threads: not timed
            kernel, script = [], []
            sides = ((in_kernel, kernel), (in_script, script))
            for i in range(turns):
                for measure, found in sides if i % 2 else sides[::-1]:
                    found.append(measure(calls))
            _execute(kc, "%rpc_shutdown")
            kc.stop_channels()
        finally:
            started += _children(proc.pid)
            proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
            km.shutdown_kernel(now=True)
            kill_pids(sorted(set(started + [proc.pid])))
    ratios = [k / s for k, s in zip(kernel, script)]
    return {"kernel_ms": statistics.median(kernel), "script_ms": statistics.median(script),
            "ratio": statistics.median(ratios), "turns": turns, "calls": calls}


def beside_row(found: dict) -> dict:
    return row("user_kernel_beside_script_sync", found["kernel_ms"], found["script_ms"], ratio=found["ratio"],
               note=f"median of {found['turns']} turns' ratios, {found['calls']} calls a turn, "
                    "both clusters running at once")


def user_rows(found: dict[str, list[dict]]) -> list[dict]:
    """Each nbrpc side against the script at torch's defaults (``user_<side>_<figure>``),
    and its small calls against the script told to use ``uv`` (``..._uv``)."""
    pairs = [(side, name, "raw", "") for side in ("kernel", "script") for name in FIGURES]
    pairs += [(side, name, "raw_uv", "_uv") for side in ("kernel", "script") for name in FIGURES if name != "tensor"]
    rows = []
    for side, name, reference, suffix in pairs:
        if not found.get(reference):
            continue
        ours, raw = ([run[FIGURES[name]] for run in found[s]] for s in (side, reference))
        middle = statistics.median(raw)
        spread = max((max(r / middle, middle / r) for r in raw), default=None)
        rows.append(row(f"user_{side}_{name}{suffix}", statistics.median(ours), middle, spread=spread,
                        note=f"medians of {len(ours)} whole runs a side; runs: "
                             f"{', '.join(f'{x:.4g}' for x in ours)} against {', '.join(f'{x:.4g}' for x in raw)}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="whole runs of each side")
    parser.add_argument("--calls", type=int, default=1000, help="small calls a run (remote: half)")
    parser.add_argument("--trips", type=int, default=3, help="100 MiB round trips a run")
    parser.add_argument("--turns", type=int, default=30, help="turns of the kernel beside the script")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    def progress(message: str) -> None:
        print(f"bench: {message}", file=sys.stderr, flush=True)

    found = take_turns(args.runs, args.calls, args.trips, progress)
    rows = user_rows(found)
    progress("user's comparison: a kernel beside a script")
    rows.append(beside_row(kernel_beside_script(args.turns)))
    for r in rows:
        print(f"{r['id']:<24} {r['nbrpc']:>10.4g} {r['reference']:>10.4g} {r['ratio']:>6.2f}  {r['target']}")
    write_rows(rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
