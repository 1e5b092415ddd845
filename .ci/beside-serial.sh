#!/usr/bin/env bash
# What CI runs beside the serial tests (make test BESIDE_SERIAL=..., at the idle priority:
# see .ci/beside.sh): the lint, the notebooks, the docs, then, once .ci/run's background
# install of the newest torch has ended, that torch's tests that may run beside others.
# Each step prints how long it took, as .ci/run's tiers do.
set -euo pipefail
cd "$(dirname "$0")/.."

step() {
    local start=$SECONDS
    echo "== ci (beside the serial tests): $* ($(date -u +%H:%M:%S))"
    "$@"
    echo "== ci (beside the serial tests): $* took $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
}

newest_env() {
    # .ci/run writes the install's exit status here when it ends.
    until [ -f build/newest-env.status ]; do sleep 5; done
    if [ "$(cat build/newest-env.status)" != 0 ]; then
        cat build/newest-env.log
        return 1
    fi
}

step make lint
step make test-notebooks
step make docs
step newest_env
# Two at once, as the notebooks (Makefile, NBVAL_XDIST): at the idle priority, three starve.
step make test-newest-parallel PARALLEL=2
