"""How many students fit on one server: each an nbrpc kernel with an idle 2-worker cluster.

    python benchmarks/classroom.py [--students 4] [--rest 10]

Starts ``--students`` real kernels of the nbrpc kernel spec (each with its private
network), one after another; each runs ``%load_ext nbrpc`` and ``%rpc_init -n 2`` and
then idles. Measures, per student, the memory of its processes (PSS of the kernel, its
warm template and its two workers: shared pages split among the processes that share
them), the CPU all students use at rest over ``--rest`` seconds, and the time of each
``%rpc_init -n 2`` while the students before it idle (the last one: while all the others
do; a kernel's first start includes its warm template's own start, its next does not).
Prints a table and what 30 students would take by the per-student figures, with the
machine's load average (a shared machine's other work slows every start).

Not measured here: the Jupyter server each student has under a hub, and the hub and
its proxy (once per server). Every kernel runs as this user (capacity, not isolation,
is measured; ``tests/test_private_network.py`` has the real users).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_STUDENTS, TARGET_INIT_S = 30, 3.0


def pss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def execute(kc, code: str, timeout: float = 300) -> str:
    """Run ``code``; return its stdout; raise with the kernel's error."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{reply['content'].get('ename')}: {reply['content'].get('evalue')}")
    return "".join(out)


class Student:
    """One nbrpc kernel with a 2-worker cluster."""

    def __init__(self, specs, folder: str):
        from jupyter_client import KernelManager

        from nbrpc.shared_server import kernel

        self.km = KernelManager(kernel_name=kernel.NAME, kernel_spec_manager=specs)
        self.km.start_kernel(cwd=folder)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=300)
        began = time.perf_counter()
        execute(self.kc, "%load_ext nbrpc")
        self.load_s = time.perf_counter() - began
        began = time.perf_counter()
        execute(self.kc, "%rpc_init -n 2")
        self.init_s = time.perf_counter() - began
        assert execute(self.kc, "import torch.distributed.rpc as rpc\nprint(rpc.rpc_sync('worker2', pow, "
                                "args=(3, 4)))").strip() == "81"

    def pids(self) -> list[int]:
        kernel = psutil.Process(self.km.provisioner.pid)
        return [kernel.pid, *(p.pid for p in kernel.children(recursive=True))]

    def close(self) -> None:
        try:
            execute(self.kc, "%rpc_shutdown", timeout=120)
        finally:
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=True)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=4)
    parser.add_argument("--rest", type=float, default=10.0, help="seconds of rest the CPU is measured over")
    args = parser.parse_args()
    from jupyter_client.kernelspec import KernelSpecManager

    from nbrpc.shared_server import kernel

    load_before = os.getloadavg()
    students: list[Student] = []
    with tempfile.TemporaryDirectory(prefix="classroom-") as folder:
        installed = kernel.install(prefix=os.path.join(folder, "prefix"))
        specs = KernelSpecManager(kernel_dirs=[os.path.dirname(installed)])
        try:
            for i in range(args.students):
                students.append(Student(specs, folder))
                print(f"student {i + 1}: %load_ext nbrpc in {students[-1].load_s:.2f} s, "
                      f"%rpc_init -n 2 in {students[-1].init_s:.2f} s "
                      f"({i} others idle)", file=sys.stderr, flush=True)
            time.sleep(2.0)  # start-up allocations settle
            memory = [sum(pss_mib(p) for p in s.pids()) for s in students]
            processes = [len(s.pids()) for s in students]
            every = [p for s in students for p in s.pids()]
            before, began = cpu_seconds(every), time.monotonic()
            time.sleep(args.rest)
            at_rest = (cpu_seconds(every) - before) / (time.monotonic() - began)
            last = students[-1]  # a kernel's next cluster: its template is warm
            execute(last.kc, "%rpc_shutdown")
            began = time.perf_counter()
            execute(last.kc, "%rpc_init -n 2")
            again = time.perf_counter() - began
        finally:
            for s in students:
                s.close()
    inits = [s.init_s for s in students]
    loads = [s.load_s for s in students]
    per_student = statistics.median(memory)
    print(f"\nclassroom: {args.students} students, each the nbrpc kernel + %rpc_init -n 2, idle "
          f"(load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
          f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB)")
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| processes per student | {statistics.median(processes):.0f} (kernel, template, 2 workers) |")
    print(f"| memory per student (PSS) | {per_student:.0f} MiB (min {min(memory):.0f}, max {max(memory):.0f}) |")
    print(f"| CPU at rest, all {args.students} | {at_rest * 100:.1f} % of one core |")
    print(f"| %rpc_init -n 2, first student | {inits[0]:.2f} s |")
    print(f"| %rpc_init -n 2, last ({args.students - 1} idle) | {inits[-1]:.2f} s |")
    print(f"| %rpc_init -n 2, median | {statistics.median(inits):.2f} s |")
    slow = [i + 1 for i, s in enumerate(inits) if s >= TARGET_INIT_S]
    print(f"| %rpc_init -n 2, slowest | {max(inits):.2f} s (target: each < {TARGET_INIT_S:g} s: "
          f"{'met' if not slow else f'missed by student {slow}'}) |")
    print(f"| %load_ext nbrpc before it (imports torch), median / slowest | {statistics.median(loads):.2f} / "
          f"{max(loads):.2f} s |")
    print(f"| the last kernel's next %rpc_init -n 2 ({args.students - 1} idle) | {again:.2f} s |")
    print(f"| {TARGET_STUDENTS} students by these figures | {TARGET_STUDENTS * per_student / 1024:.1f} GiB, "
          f"{TARGET_STUDENTS * at_rest / args.students * 100:.1f} % of one core at rest |")
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
