#!/usr/bin/env bash
# The checks that need a GPU, in one run of under 9 minutes on a machine with one NVIDIA
# GPU and 16 cores, torch already installed (a CUDA build), no internet:
#
#   (a) the gpu-marked tests (tests/test_cuda.py and any other file marking tests gpu),
#       after the join audit's checks under this machine's torch (tests/test_compat.py's
#       init_rpc steps, tests/test_membership.py);
#   (b) torch's CUDA RPC conformance suites, raw and with nbrpc's patches, both modes at
#       once, each spread over pytest-xdist workers (conformance/run.py);
#   (c) benchmarks/cuda_rpc.py, the CUDA section of make bench;
#   (d) tutorials/06_cuda_rpc.ipynb executed with nbclient, written to $OUT.
#
# Each step has a time cap and its own log in $OUT (a-gpu-tests.log, b-conformance.log,
# c-bench-cuda.log, d-tutorial-06.log; summary.txt has each step's exit status and time).
# Every process a step starts carries NBRPC_GPU_CHECK in its environment, and whatever
# is left when the step ends (a kernel that outlived a cap) is ended by pid.
#
# Run from the repository root, with the wheels of conformance/gpu_wheels.txt in .whl/:
#
#   PYTHON=/opt/torch/.venv/bin/python3 bash conformance/gpu_check.sh
#
# PYTHON (default python3) must have torch; the wheels go to SITE (default /tmp/site),
# which PYTHONPATH then holds, after the repository itself. OUT defaults to build/gpu_check.
# STEPS="a c" runs only those steps; CHECK_ONLY=1 lists the steps without running them; SKIP_INSTALL=1 uses PYTHON's own packages.
set -u

PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-build/gpu_check}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUN_MARK="$$-$(date +%s)"
: > "$OUT/summary.txt"

# Caps in seconds: 140 + 250 + 50 + 60 = 500 s of steps, plus the wheels' install (about
# 20 s): under 9 minutes in all.
CAP_TESTS=${CAP_TESTS:-140}
CAP_CONFORMANCE=${CAP_CONFORMANCE:-250}
CAP_BENCH=${CAP_BENCH:-50}
CAP_TUTORIAL=${CAP_TUTORIAL:-60}

GPU_TEST_FILES=$(grep -l "mark\.gpu" tests/test_*.py | tr '\n' ' ')
CUDA_SUITES=TensorPipeTensorPipeAgentCudaRpcTest,TensorPipeCudaRpcTest,TensorPipeCudaDistAutogradTest,TensorPipeCudaRemoteModuleTest,TensorPipeTensorPipeCudaDistAutogradTest

sweep() {
    # End, by pid, every process still marked with this run's step (see the header).
    env -u NBRPC_GPU_CHECK "$PYTHON" - "$1" <<'EOF'
import os, signal, sys
mark = f"NBRPC_GPU_CHECK={sys.argv[1]}".encode()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if mark in f.read().split(b"\0"):
                os.kill(int(pid), signal.SIGKILL)
                print(f"ended leftover process {pid}")
    except (OSError, ProcessLookupError):
        pass
EOF
}

step() {
    # step NAME CAP COMMAND: run COMMAND (bash) with a time cap, its output in $OUT/NAME.log.
    local name=$1 cap=$2 command=$3 began rc
    case " ${STEPS:-a b c d} " in *" ${name%%-*} "*) ;; *) return 0 ;; esac
    began=$(date +%s)
    if [ -n "${CHECK_ONLY:-}" ]; then
        printf '%s (cap %s s): %s\n' "$name" "$cap" "$command" | tee -a "$OUT/summary.txt"
        return 0
    fi
    NBRPC_GPU_CHECK="$RUN_MARK-$name" timeout -k 15 "$cap" bash -c "$command" > "$OUT/$name.log" 2>&1
    rc=$?
    sweep "$RUN_MARK-$name" >> "$OUT/$name.log" 2>&1
    [ "$rc" = 124 ] && echo "(stopped at its cap of $cap s)" >> "$OUT/$name.log"
    printf '%s: exit %s after %s s (cap %s s)\n' "$name" "$rc" "$(( $(date +%s) - began ))" "$cap" \
        | tee -a "$OUT/summary.txt"
}

# The wheels this machine lacks, installed where PYTHONPATH finds them (SKIP_INSTALL=1:
# PYTHON has them already).
if [ -z "${CHECK_ONLY:-}${SKIP_INSTALL:-}" ]; then
    "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$SITE" .whl/*.whl > "$OUT/install.log" 2>&1 \
        || { echo "install: failed, see install.log" | tee -a "$OUT/summary.txt"; exit 1; }
fi
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
# The python3 kernel runs this Python (with this PYTHONPATH): the wheel's own kernel.json,
# under $SITE/share, would run whatever "python" is first on PATH.
if [ -z "${CHECK_ONLY:-}" ]; then
    "$PYTHON" -m ipykernel install --prefix "$SITE/kernel" --name python3 >> "$OUT/install.log" 2>&1 \
        || { echo "install: the python3 kernel spec failed, see install.log" | tee -a "$OUT/summary.txt"; exit 1; }
fi
export JUPYTER_PATH="$SITE/kernel/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}"
{
    echo "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null), $(nproc) cores"
    "$PYTHON" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
} | tee -a "$OUT/summary.txt"

step a-gpu-tests "$CAP_TESTS" "
    set -x
    $PYTHON -m pytest -p no:cacheprovider -p no:benchmark -q tests/test_compat.py::test_init_rpc_has_the_steps_that_join_repeats tests/test_membership.py
    audit=\$?
    $PYTHON -m pytest -p no:cacheprovider -p no:benchmark -q -m gpu -n 4 $GPU_TEST_FILES
    gpu=\$?
    exit \$(( audit || gpu ))"

step b-conformance "$CAP_CONFORMANCE" "
    $PYTHON conformance/run.py --suites $CUDA_SUITES --jobs 10 --xdist 6 --timeout 120 --deadline $((CAP_CONFORMANCE - 40))
    rc=\$?
    mkdir -p '$OUT/conformance' && cp -r build/conformance/raw build/conformance/nbrpc '$OUT/conformance/'
    exit \$rc"

step c-bench-cuda "$CAP_BENCH" "
    $PYTHON benchmarks/run.py --cuda
    calls=\$?
    $PYTHON benchmarks/cuda_rpc.py
    rc=\$(( calls || \$? ))
    cp build/bench_cuda.json '$OUT/' 2>/dev/null
    exit \$rc"

step d-tutorial-06 "$CAP_TUTORIAL" "
    $PYTHON - <<'EOF'
import nbformat
from nbclient import NotebookClient
notebook = nbformat.read('tutorials/06_cuda_rpc.ipynb', as_version=4)
NotebookClient(notebook, timeout=60, kernel_name='python3',
               resources={'metadata': {'path': 'tutorials'}}).execute()
nbformat.write(notebook, '$OUT/06_cuda_rpc.ipynb')
print('executed tutorials/06_cuda_rpc.ipynb ->', '$OUT/06_cuda_rpc.ipynb')
EOF"


