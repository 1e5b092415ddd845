"""A base install is clean: an environment with only nbrpc's declared dependencies (no
extras, no test tools) loads the extension, runs a cluster and shows nothing from torch.

The environment gets this torch and nbrpc's runtime dependencies from pyproject.toml; nbrpc
itself comes from the repository through a ``.pth`` file, so that nothing is built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib
import torch
from conftest import RUN_MARK

import nbrpc

pytestmark = pytest.mark.slow

ROOT = Path(nbrpc.__file__).parent.parent

SESSION = r"""
import json
from jupyter_client.manager import start_new_kernel

# A real kernel, as a notebook has: what its cells print on stderr is what a student sees in red.
km, kc = start_new_kernel(kernel_name="python3")
cells = ["%load_ext nbrpc", "%rpc_init -n 1",
         "import torch, torch.distributed.rpc as rpc\n"
         "print(rpc.rpc_sync('worker1', torch.add, args=(torch.ones(2), 1)).tolist())",
         "%rpc_shutdown"]
shown = {"stdout": "", "stderr": "", "errors": []}
try:
    for code in cells:
        msg_id = kc.execute(code)
        while True:
            msg = kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                shown[content["name"]] += content["text"]
            elif kind == "error":
                shown["errors"].append(content["ename"] + ": " + content["evalue"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=False)
print(json.dumps(shown))
"""


def _base_environment(path: Path) -> Path:
    """A virtual environment with this torch and nbrpc's declared dependencies only."""
    venv.create(path)
    python = path / "bin" / "python"
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    # As the Makefile does: with uv, torch from the wheels pip is told of (the machine's
    # own), else PyPI. Not compiled, as uv leaves an install: the session compiles what it imports.
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is missing from this environment: pip install -e '.[test]' installs it"
    torch_release = f"torch=={torch.__version__.split('+')[0]}"
    subprocess.run([uv, "pip", "install", "--python", python, "--quiet", *find_links(), torch_release,
                    *[d for d in declared if not d.startswith("torch")]], check=True, timeout=900)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "nbrpc-repository.pth").write_text(str(ROOT) + "\n")
    return python


def find_links() -> list[str]:
    """uv's ``--find-links`` for the wheels pip is told of (as the Makefile's FIND_LINKS)."""
    places = os.environ.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True).stdout
    return [arg for place in places.split() for arg in ("--find-links", place)]


def test_the_base_install_runs_a_cluster_and_prints_nothing_of_torchs(tmp_path):
    python = _base_environment(tmp_path / "env")
    listed = subprocess.run([python, "-c", "import importlib.metadata as m, json; "
                             "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"],
                            capture_output=True, text=True, check=True).stdout
    installed = {name.lower() for name in json.loads(listed)}
    assert {"numpy", "torch"} <= installed and not {"pytest", "matplotlib", "nbval"} & installed
    done = subprocess.run([python, "-c", SESSION], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                             RUN_MARK: os.environ[RUN_MARK]})
    assert done.returncode == 0, done.stderr[-3000:]
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["errors"] == [] and "[2.0, 2.0]" in shown["stdout"], shown
    # the cells show nothing of torch's (NumPy's absence, deprecations) on stderr
    assert shown["stderr"] == "", shown["stderr"]
    assert sys.executable != str(python)
