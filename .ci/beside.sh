#!/usr/bin/env bash
# beside.sh "BESIDE" COMMAND...: runs COMMAND (the serial tests) and, while it runs, the
# shell command BESIDE (tests that assert no timing) at the idle priority (SCHED_IDLE,
# chrt --idle): the kernel gives BESIDE only the CPU that COMMAND's processes leave idle,
# and takes it back the moment one of them wakes, so their timings hold; serial tests
# mostly wait, so BESIDE gets most of it. (Where the kernel groups a session's processes,
# sched_autogroup_enabled, a session that BESIDE starts gets its share back: CI turns
# that off, .ci/run.) BESIDE's output is shown when both have ended; the exit status is
# the first failure's.
set -uo pipefail
beside=$1
shift
mkdir -p build
log=build/beside.log
if [ -z "$beside" ]; then exec "$@"; fi
idle=(chrt --idle 0)
command -v chrt >/dev/null || idle=(nice -n 19)
# Its own process group (no new session: autogroups are per session), ended if this
# script is stopped: first as the stop button does, so that the tests end their clusters.
set -m
"${idle[@]}" bash -c "$beside" > "$log" 2>&1 &
pid=$!
set +m
trap 'kill -INT -- -$pid 2>/dev/null && sleep 10; kill -- -$pid 2>/dev/null || true' EXIT
"$@"
status=$?
wait "$pid"
beside_status=$?
echo "== beside the serial tests: $beside (exit $beside_status)"
cat "$log"
[ "$status" -ne 0 ] && exit "$status"
exit "$beside_status"
