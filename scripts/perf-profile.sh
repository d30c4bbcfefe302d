#!/usr/bin/env bash
# perf-profile.sh: a perf profile of evoked alone while evoke-bench runs some
# of its cases against it (the bench client and Redis are not in it).
#
#   scripts/perf-profile.sh CASES OUT [CASE_MIB]
#
#   CASES     evoke-bench --only filter, e.g. "save shm 1M 1 1" or "lat4k ring"
#   OUT       prefix of the outputs: OUT.data (perf record), OUT.txt (the
#             bench's output, then the daemon's top symbols, self time)
#   CASE_MIB  bytes moved per case (default 1024)
#
# The daemon runs with the flags evoke-bench gives its own. perf records only
# while a case's timed pass runs (evoke-bench switches it through
# EVOKE_BENCH_PERF_CTL), not the untimed setup and warm-up of each case.
# Needs perf (linux-perf) and a kernel.perf_event_paranoid that lets this
# user profile its own processes.
set -euo pipefail
cd "$(dirname "$0")/.."
CASES=${1:?cases (an evoke-bench --only filter)}
OUT=${2:?output prefix}
MIB=${3:-1024}
BUILD=${EVOKE_BUILD_DIR:-build}
dir=$(mktemp -d /tmp/evoke-perf-XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
pinned=$(( (3 * MIB > 1024 ? 3 * MIB : 1024) << 20 ))
mkfifo "$dir/ctl" "$dir/ack"
perf record -F 4000 -g -D -1 --control "fifo:$dir/ctl,$dir/ack" -o "$OUT.data" -- \
  "$BUILD/daemon/evoked" --socket "$dir/evoked.sock" \
  --data-dir "$dir/data" --pinned-bytes "$pinned" --spill-bytes 8GiB --max-block-bytes 64MiB \
  --log-level warning 2>"$dir/evoked.log" &
pid=$!
for _ in $(seq 100); do [[ -S $dir/evoked.sock ]] && break; sleep 0.1; done
EVOKE_BENCH_PERF_CTL="$dir/ctl,$dir/ack" "$BUILD/bench/evoke-bench" --quick --target "$dir/evoked.sock" --only "$CASES" \
  --case-mib "$MIB" > "$OUT.txt"
# SIGINT: perf writes its file and stops the daemon.
kill -INT "$pid"
wait "$pid" || true
{
  echo
  echo "# evoked, self time by symbol (perf report --no-children --sort sym)"
  perf report -i "$OUT.data" --no-children --sort sym --stdio -g none 2>/dev/null |
    grep -v "^#" | grep "%" | head -40 || true
} >> "$OUT.txt"
cat "$OUT.txt"
