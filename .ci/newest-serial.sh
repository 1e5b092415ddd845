#!/usr/bin/env bash
# CI's last serial step (make test AFTER_SERIAL=...), right after the serial tests and the
# notebooks that run alone, while what runs beside them goes on: the newest torch's serial
# tests, once its environment, which .ci/beside-serial.sh installs beside them, is ready.
set -euo pipefail
cd "$(dirname "$0")/.."
# It installs in a few minutes; the serial tests take over ten.
for _ in $(seq 900); do
    [ -s build/newest-env.status ] && break
    sleep 2
done
if [ "$(cat build/newest-env.status 2>/dev/null)" != 0 ]; then
    echo "the newest torch's environment did not install (build/newest-env.status: $(cat build/newest-env.status 2>/dev/null || echo missing)):"
    cat build/newest-env.log 2>/dev/null || true
    exit 1
fi
start=$SECONDS
echo "== ci: make test-newest-serial ($(date -u +%H:%M:%S))"
make test-newest-serial
echo "== ci: make test-newest-serial took $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"
