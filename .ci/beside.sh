#!/usr/bin/env bash
# beside.sh "BESIDE" COMMAND...: runs COMMAND (the serial tests) at normal priority and,
# while it runs, the shell command BESIDE (tests that assert no timing) at a low one
# (nice 10). The kernel gives the CPU to COMMAND's processes first, so their timings hold;
# BESIDE takes what they leave idle, which is most of it: serial tests mostly wait.
# BESIDE's output is shown when both have ended; the exit status is the first failure's.
set -uo pipefail
beside=$1
shift
mkdir -p build
log=build/beside.log
if [ -z "$beside" ]; then exec "$@"; fi
# Its own process group, ended with it if this script is stopped (make, pytest, kernels).
setsid -w nice -n 10 bash -c "$beside" > "$log" 2>&1 &
pid=$!
trap 'kill -- -$pid 2>/dev/null || true' EXIT
"$@"
status=$?
wait "$pid"
beside_status=$?
echo "== beside the serial tests: $beside (exit $beside_status)"
cat "$log"
[ "$status" -ne 0 ] && exit "$status"
exit "$beside_status"
