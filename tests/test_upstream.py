"""The upstream corpus: every program of pytorch/examples ``distributed/rpc/`` and the code of
PyTorch's RPC tutorials, ported into notebook cells (``tests/upstream/<program>.py``, cells
separated by ``# %%`` lines, each file's header naming its source and every change), run in a
fresh kernel through nbclient and checked on what the original prints or computes."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import cell_text, execute_cells, free_port

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).parent / "upstream"
# A cell that is only this line is replaced by the named file of tests/upstream/ (code that
# upstream imports from a package that cannot be installed here, copied from that package).
INCLUDE = re.compile(r"# include (_\w+\.py)")
# One notebook may take this long; the whole module stays within about 5 minutes on 2 idle cores.
CELL_TIMEOUT = 240


def port(program: str) -> list[str]:
    """The cells of ``tests/upstream/<program>.py`` (its header dropped, includes filled in)."""
    text = (UPSTREAM / f"{program}.py").read_text()
    cells = [c.strip() for c in re.split(r"^# %%.*\n", text, flags=re.M)[1:]]
    return [(UPSTREAM / m.group(1)).read_text() if (m := INCLUDE.fullmatch(c)) else c for c in cells]


def index_of(cells: list[str], start: str) -> int:
    """The index of the one cell that starts with ``start``."""
    (found,) = [i for i, c in enumerate(cells) if c.startswith(start)]
    return found


def floats(pattern: str, text: str) -> list[tuple[float, ...]]:
    return [tuple(float(g) for g in m.groups()) for m in re.finditer(pattern, text)]


def run_script(source: str, folder: Path, pids, timeout: float = 180) -> str:
    """Run ``source`` as a script (a fresh interpreter, its own session); return its stdout."""
    script = folder / "script.py"
    script.write_text(source)
    proc = subprocess.Popen([sys.executable, str(script)], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids.add_tree(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pids.end()
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"the script ran over {timeout} s; its stderr:\n{err[-3000:]}")
    assert proc.returncode == 0, f"the script failed ({proc.returncode}):\n{err[-3000:]}"
    return out


# --- rl ---------------------------------------------------------------------------------------

RL_EPISODE = r"Episode (\d+)\tLast reward: ([\d.]+)\tAverage reward: ([\d.]+)"

RL_SPAWN = '''
def run_worker(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '{port}'
    # On uv, as nbrpc's members: torch's default adds shm, whose pollers spin a core per process.
    options = rpc.TensorPipeRpcBackendOptions(_transports=["uv"])
    if rank == 0:
        # rank0 is the agent
        rpc.init_rpc(AGENT_NAME, rank=rank, world_size=world_size, rpc_backend_options=options)
{agent}
    else:
        # other ranks are the observer
        rpc.init_rpc(OBSERVER_NAME.format(rank), rank=rank, world_size=world_size, rpc_backend_options=options)
        # observers passively waiting for instructions from agents
    rpc.shutdown()


def main():
    mp.spawn(
        run_worker,
        args=(args.world_size, ),
        nprocs=args.world_size,
        join=True
    )

if __name__ == '__main__':
    main()
'''


def check_rl(notebook, cells, folder, pids):
    agent = index_of(cells, "# rank 0 of run_worker")
    printed = cell_text(notebook.cells[agent])
    episodes = floats(RL_EPISODE, printed)
    assert [e[0] for e in episodes] == [10, 20, 30, 40], printed
    assert all(0 < e[1] <= 500 for e in episodes), printed
    assert episodes[-1][2] > episodes[0][2], f"the running reward did not grow:\n{printed}"
    # One observer: the run is deterministic with the seed, so the script run under mp.spawn with
    # torch's own init_rpc, built from the same cells, prints the same lines.
    body = "\n".join(line for line in cells[agent].splitlines() if line != "world_size = args.world_size")
    script = cells[index_of(cells, "import argparse")] + RL_SPAWN.format(
        port=free_port(), agent=textwrap.indent(body, " " * 8))
    assert run_script(script, folder, pids) == printed


# --- parameter_server -------------------------------------------------------------------------

# Not upstream: after the run, the server both trainers trained is the driver's module-level
# param_server (which the first trainer's remote() set under the module's lock), and each trainer
# kept its own module-level param_server, still None.
PARAMETER_SERVER_PROBE = """# probe
print(type(param_server).__name__,
      [rpc.rpc_sync(t, lambda: __import__("__main__").param_server is None) for t in ("trainer_1", "trainer_2")])"""


def check_parameter_server(notebook, cells, folder, pids):
    assert cell_text(notebook.cells[index_of(cells, "# probe")]) == "ParameterServer [True, True]\n"
    losses = {}
    for rank in (1, 2):
        printed = cell_text(notebook.cells[index_of(cells, f"%%rpc_on trainer_{rank}\n")])
        losses[rank] = floats(rf"\[trainer_{rank}\] Rank {rank} training batch (\d+) loss ([\d.]+)", printed)
        assert [b for b, _ in losses[rank]] == [0, 5, 10, 15, 20, 25], printed
        for line in ("Training complete!", "Getting accuracy...."):
            assert f"[trainer_{rank}] {line}\n" in printed, printed
        # The server prints as the first trainer's remote() builds it, once, under its lock.
        built = "Using 0 GPUs to train\nPutting first 2 convs on cpu\nPutting rest of layers on cpu\n"
        assert printed.count(built) == (rank == 1), printed
        (accuracy,) = floats(rf"\[trainer_{rank}\] Accuracy ([\d.]+)", printed)
        assert accuracy[0] > 0.4, printed  # of 10 classes
    # Both trainers train the server's one model, one after the other, and a batch's loss is
    # noisy (dropout, 32 samples): the loss falls from the first trainer's first batch to the
    # second trainer's last three.
    first, last = losses[1][0][1], statistics.mean(loss for _, loss in losses[2][-3:])
    assert last < 0.75 * first, f"the loss did not fall: {losses}"


# --- rnn ---------------------------------------------------------------------------------------

def check_rnn(notebook, cells, folder, pids):
    printed = cell_text(notebook.cells[index_of(cells, "# the trainer's branch of run_worker")])
    assert printed == "".join(f"Training epoch {epoch}\n" for epoch in range(10))


# --- batch_reinforce -----------------------------------------------------------------------------

def check_batch_reinforce(notebook, cells, folder, pids):
    printed = cell_text(notebook.cells[index_of(cells, "def run_agent(")])
    episodes = floats(r"Episode (\d+)\tLast reward: ([\d.]+)\tAverage reward: ([\d.]+)", printed)
    # batch=True, then batch=False, ten episodes each
    assert [int(e[0]) for e in episodes] == list(range(10)) * 2, printed
    assert all(1 <= e[1] <= 100 and e[2] <= 100 for e in episodes), printed  # NUM_STEPS
    (timing,) = floats(r"^2, ([\d.]+), ([\d.]+)$", printed.splitlines()[-1])
    assert all(t > 0 for t in timing), printed


# --- pipeline ----------------------------------------------------------------------------------

def check_pipeline(notebook, cells, folder, pids):
    printed = cell_text(notebook.cells[index_of(cells, "# main(): the master's part of each run")])
    runs = re.findall(r"((?:Processing batch \d\n)*)number of splits = (\d+), execution time = ([\d.]+)\n", printed)
    assert [split for _, split, _ in runs] == ["1", "2", "4", "8"], printed
    batches_of_each = "Processing batch 0\nProcessing batch 1\nProcessing batch 2\n"
    assert all(batches == batches_of_each for batches, _, _ in runs), printed
    assert "".join(f"{b}number of splits = {s}, execution time = {t}\n" for b, s, t in runs) == printed


# --- batch_parameter_server ----------------------------------------------------------------------

def check_batch_parameter_server(notebook, cells, folder, pids):
    printed = cell_text(notebook.cells[index_of(cells, "# rank 0 of run(): the parameter server")])
    # Each line is "HH:MM:SS text", a trainer's tagged. The server's update_and_fetch_model runs on
    # two RPC threads at once, and print() writes its text and its newline apart, so two of its lines
    # may run together ("...updatesHH:MM:SS PS got ...\n\n"), as they may in the plain script.
    lines = [text for text in re.split(r"(?:\[\w+\] )?\d\d:\d\d:\d\d |\n", printed) if text]
    assert lines[0] == "Start training" and lines[-1] == "Finish training", printed
    # 2 trainers x 2 batches reach the server; every 2nd update steps the optimizer
    assert sum(re.fullmatch(r"PS got [01]/2 updates", line) is not None for line in lines) == 4, printed
    assert lines.count("PS updated model") == 2, printed


# --- ddp_rpc -------------------------------------------------------------------------------------

def check_ddp_rpc(notebook, cells, folder, pids):
    trainers = "%%rpc_on trainer0,trainer1\n"
    for start in (f"{trainers}# rank", f"{trainers}# Clean"):
        cell = notebook.cells[index_of(cells, start)]
        assert cell.outputs == [], cell.outputs  # the process group forms and goes quietly
    # The master's cell returned: both trainers' _run_trainer ran to the end (fut.wait() raises a
    # trainer's error), and each step's DDP allreduce needs both trainers in it.
    printed = cell_text(notebook.cells[-1])
    assert printed == "Distributed RPC example completed successfully.\n", printed
    # Each trainer prints an epoch's line from _run_trainer, which the master runs on it over RPC:
    # the lines show in the master's cell, tagged with the trainer, in order per trainer.
    epochs = int(re.search(r"^EPOCHS = (\d+)$", cells[index_of(cells, "import random")], re.M).group(1))
    master = cell_text(notebook.cells[index_of(cells, "# rank 2 of run_worker")])
    for trainer in ("trainer0", "trainer1"):
        lines = re.findall(rf"^\[{trainer}\] Training done for epoch (\d+)$", master, re.M)
        assert lines == [str(epoch) for epoch in range(epochs)], master


# --- cuda_rpc (gpu) ----------------------------------------------------------------------------

def check_cuda_rpc(notebook, cells, folder, pids):
    printed = cell_text(notebook.cells[index_of(cells, "# rank 0 of run_worker")])
    times = floats(r"(?m)^(?:cpu|cuda) RPC total execution time: ([\d.e-]+)$", printed)
    assert re.findall(r"^(cpu|cuda) RPC", printed, re.M) == ["cpu", "cuda"] and len(times) == 2, printed
    (staged,), (direct,) = times
    # The recipe's point: the direct device-to-device path beats staging through CPU memory.
    assert 0 < direct < staged, printed


CHECKS = {
    "cuda_rpc": check_cuda_rpc,
    "ddp_rpc": check_ddp_rpc,
    "batch_parameter_server": check_batch_parameter_server,
    "pipeline": check_pipeline,
    "batch_reinforce": check_batch_reinforce,
    "rnn": check_rnn,
    "parameter_server": check_parameter_server,
    "rl": check_rl,
}
# Cells a check adds before the port's last (%rpc_shutdown), to look at its state.
PROBES = {"parameter_server": PARAMETER_SERVER_PROBE}
GPU = {"cuda_rpc"}
PROGRAMS = sorted(p.stem for p in UPSTREAM.glob("*.py") if not p.name.startswith("_"))


@pytest.mark.parametrize("program", [pytest.param(p, marks=[pytest.mark.gpu] if p in GPU else [])
                                     for p in PROGRAMS])
def test_upstream_program_runs_from_cells(program, tmp_path, pids):
    cells = port(program)
    if program in PROBES:
        cells.insert(len(cells) - 1, PROBES[program])
    notebook = execute_cells(tmp_path, cells, timeout=CELL_TIMEOUT)
    CHECKS[program](notebook, cells, tmp_path, pids)


def test_every_port_names_its_source_and_is_checked():
    for program in PROGRAMS:
        header = (UPSTREAM / f"{program}.py").read_text().split("# %%")[0]
        source = r"Upstream: pytorch/(examples|tutorials), .+?,\s+(# )?commit [0-9a-f]{40}"
        assert re.search(source, header, re.S), program
        assert "Changes" in header, program
    assert set(CHECKS) == set(PROGRAMS)
