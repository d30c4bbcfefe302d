#!/usr/bin/env bash
# bench-profile.sh: where evoked spends its CPU during some evoke-bench cases.
#
#   scripts/bench-profile.sh EVOKED EVOKE_BENCH OUT_PREFIX ONLY [BENCH_ARGS...]
#
# Starts EVOKED (the flags evoke-bench gives its own), records it with
# `perf record -e cpu-clock -g` (no hardware counters on these VMs) while
# `EVOKE_BENCH --target SOCKET --only ONLY BENCH_ARGS...` runs against it,
# then writes:
#   OUT_PREFIX.bench.txt   the bench's output
#   OUT_PREFIX.top.txt     perf report --no-children --stdio, first 60 lines
#                          (the top entries, self time)
#   OUT_PREFIX.dso.txt     self time per shared object (kernel, libc, evoked)
# The perf data itself stays in a temp dir (large); keep it with KEEP_DATA=1.
#
# perf records only while a case's timed pass runs (evoke-bench switches it
# through EVOKE_BENCH_PERF_CTL), not the untimed setup and warm-up of each
# case (first touches of fresh regions, the saves before a load case). An
# evoke-bench from before issue #26 cannot switch it: profile those with
# WHOLE_RUN=1, which records from start to end.
#
# Example (issue #12, the 4 KiB and 1 MiB shared-memory cases):
#   scripts/bench-profile.sh build/daemon/evoked build/bench/evoke-bench \
#     bench/results/issue12_perf_after_4k 'lat4k' --quick --goals-only
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n 2,20p "$0" >&2
  exit 2
fi
EVOKED=$(realpath "$1")
BENCH=$(realpath "$2")
OUT=$3
ONLY=$4
shift 4
DIR=$(mktemp -d /tmp/evoke-bench-profile-XXXXXX)
SOCK=$DIR/evoked.sock
cleanup() {
  [ -n "${PERF_PID:-}" ] && kill -INT "$PERF_PID" 2>/dev/null || true
  [ -n "${EVOKED_PID:-}" ] && kill -TERM "$EVOKED_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ "${KEEP_DATA:-0}" = 1 ]; then echo "perf data kept in $DIR" >&2; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

"$EVOKED" --socket "$SOCK" --data-dir "$DIR/data" --pinned-bytes 1GiB --spill-bytes 8GiB \
  --max-block-bytes 64MiB --log-level warning > "$DIR/evoked.log" 2>&1 &
EVOKED_PID=$!
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || { echo "evoked did not start:" >&2; cat "$DIR/evoked.log" >&2; exit 1; }

PERF_ARGS=()
if [ "${WHOLE_RUN:-0}" != 1 ]; then
  mkfifo "$DIR/ctl" "$DIR/ack"
  PERF_ARGS=(-D -1 --control "fifo:$DIR/ctl,$DIR/ack")
  export EVOKE_BENCH_PERF_CTL="$DIR/ctl,$DIR/ack"
fi
perf record -e cpu-clock -g "${PERF_ARGS[@]}" -p "$EVOKED_PID" -o "$DIR/perf.data" \
  > "$DIR/perf.log" 2>&1 &
PERF_PID=$!
sleep 0.5
set +e
"$BENCH" --target "$SOCK" --only "$ONLY" "$@" > "$OUT.bench.txt" 2>&1
BENCH_RC=$?
set -e
kill -INT "$PERF_PID"
wait "$PERF_PID" 2>/dev/null || true
PERF_PID=
report() {  # report SORT_KEYS LINES
  perf report -i "$DIR/perf.data" --no-children --stdio -g none --percent-limit 0.5 \
    --sort "$1" 2>/dev/null | grep -v '^#' | grep -v '^$' | head -"$2"
}
{
  echo "# perf record -e cpu-clock -g -p <evoked> (timed passes only unless WHOLE_RUN=1: ${WHOLE_RUN:-0}) during: $(basename "$BENCH") --target SOCK --only '$ONLY' $*"
  echo "# evoked: $EVOKED ($(cd "$(dirname "$EVOKED")" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "# $(perf report -i "$DIR/perf.data" --stdio 2>/dev/null | grep -m1 '^# Samples')"
  echo "# self time by symbol: perf report --no-children --stdio -g none --sort comm,dso,sym"
  report comm,dso,sym 40
  echo "# self time by thread name: --sort comm"
  report comm 12
} > "$OUT.top.txt"
{
  echo "# self time per shared object: perf report --no-children --stdio -g none --sort dso"
  report dso 15
  echo "# callers of the kernel's share (the first frames above each kernel entry):"
  perf report -i "$DIR/perf.data" --no-children --stdio --sort dso -G --percent-limit 5 \
    2>/dev/null | grep -v '^#' | grep -v '^$' | head -80
} > "$OUT.dso.txt"
echo "bench exit status $BENCH_RC; wrote $OUT.bench.txt $OUT.top.txt $OUT.dso.txt"
exit $BENCH_RC
