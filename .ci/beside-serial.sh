#!/usr/bin/env bash
# What CI runs beside the serial tests (make test BESIDE_SERIAL=..., at the idle priority:
# see .ci/beside.sh): the newest torch's environment, installing in the background (a
# 2.8 GB download, mostly waiting on the network; beside the parallel tier, which keeps
# both cores busy, its 74 CPU seconds were that tier's), and meanwhile the lint, the tests
# marked beside, the notebooks and the docs; then that torch's tests that may run beside
# others (its serial ones wait for its environment: .ci/newest-serial.sh). Each step prints
# how long it took, as .ci/run's tiers do.
set -euo pipefail
cd "$(dirname "$0")/.."

step() {
    local start=$SECONDS
    echo "== ci (beside the serial tests): $* ($(date -u +%H:%M:%S))"
    "$@"
    echo "== ci (beside the serial tests): $* took $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
}

newest_env() {
    wait "$newest" || true
    if [ "$(cat build/newest-env.status 2>/dev/null)" != 0 ]; then
        cat build/newest-env.log
        return 1
    fi
}

# Its exit status goes to build/newest-env.status; it ends with this script's process group.
mkdir -p build
rm -f build/newest-env.status
bash -c 'make newest-env > build/newest-env.log 2>&1; echo $? > build/newest-env.status' &
newest=$!
step make lint
step make test-beside
step make test-notebooks
step make docs
step newest_env
# Two at once, as the notebooks (Makefile, NBVAL_XDIST): at the idle priority, three starve.
# NBRPC_FROZEN_AFTER=30 as for the tests marked beside (Makefile, test-beside): beside the
# newest torch's serial tests, an upstream program's member starved at the idle priority
# left the hang watch's probes unanswered and its cell showed it frozen (rl's observer1).
step env NBRPC_FROZEN_AFTER=30 make test-newest-parallel PARALLEL=2
