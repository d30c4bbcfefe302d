#!/usr/bin/env bash
# fuzz.sh: builds the libFuzzer targets (fuzz/fuzz.cmake) with clang-14 and
# ASan+UBSan into build-fuzz, replays every seed and regression input, then
# fuzzes each target for N seconds (default 60) starting from its seed corpus.
# Fails on any crash, sanitizer report, leak, timeout or out-of-memory; the
# input that caused it is left in $EVOKE_FUZZ_OUT/<target>/ (default
# build-fuzz/fuzz-out/).
#
#   scripts/fuzz.sh [seconds-per-target]
#
# Environment:
#   EVOKE_FUZZ_TARGETS  space-separated subset of the targets (default: all)
#   EVOKE_FUZZ_BUILD_DIR  build tree (default build-fuzz)
#   EVOKE_FUZZ_JOBS     build jobs (default: nproc)
#   EVOKE_FUZZ_MERGE=1  merge new coverage into fuzz/corpus/<target>/ after
#                       the run (the repo corpus only grows deliberately:
#                       otherwise the run works on a temporary copy)
#   EVOKE_FUZZ_ARGS     extra libFuzzer flags for every run (e.g. -jobs=2)
#   EVOKE_FUZZ_STRICT=1 the harnesses stop skipping the inputs of known bugs
#                       that are reported but not fixed yet (each harness
#                       names them; fuzz/regressions/ holds one input each)
#
# Long runs (recorded in RELIABILITY.md): scripts/fuzz.sh 3600
#
# The clang tree is separate from the main build because every evoke library
# the fuzzers link is compiled with clang, ASan, UBSan and coverage hooks.
# Only the fuzz targets and what they link are built (no tests, no benches,
# no llama.cpp, no CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
BUILD_DIR=${EVOKE_FUZZ_BUILD_DIR:-build-fuzz}
OUT=${EVOKE_FUZZ_OUT:-$BUILD_DIR/fuzz-out}
ALL_TARGETS="fuzz_request_validation fuzz_block_file fuzz_spill_record fuzz_daemon_flags fuzz_seq_state fuzz_ring fuzz_access_policy fuzz_inline_save fuzz_block_stream fuzz_bearer_token fuzz_remote_record fuzz_ring_service fuzz_fd_channel fuzz_segment_open fuzz_openai_request"
read -r -a TARGETS <<< "${EVOKE_FUZZ_TARGETS:-$ALL_TARGETS}"

for tool in clang-14 clang++-14; do
  if ! command -v "$tool" >/dev/null; then
    echo "fuzz: $tool not found (scripts/setup-debian.sh installs clang-14 and libclang-rt-14-dev)" >&2
    exit 1
  fi
done

args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
      -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14
      -DEVOKE_FUZZ=ON -DEVOKE_SANITIZE=address,undefined
      -DEVOKE_BUILD_TESTS=OFF -DEVOKE_BUILD_BENCH=OFF -DEVOKE_WITH_LLAMA=OFF -DEVOKE_CUDA=OFF
      -DEVOKE_WITH_RADOS=OFF)  # No fuzz target reaches tier 3; librados' headers need GCC.
if command -v ccache >/dev/null; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
start=$(date +%s)
cmake "${args[@]}" >/dev/null
cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -j "${EVOKE_FUZZ_JOBS:-$(nproc)}"
echo "fuzz: built ${#TARGETS[@]} targets in $(( $(date +%s) - start )) s"

# Sanitizers stop at the first report; leaks count (libFuzzer checks them).
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$OUT"
failed=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD_DIR/fuzz/$t"
  corpus="fuzz/corpus/$t"
  regressions="fuzz/regressions/$t"
  mkdir -p "$OUT/$t"
  log="$OUT/$t.log"
  common=(-rss_limit_mb=2048 -timeout=30 -print_final_stats=1 "-artifact_prefix=$OUT/$t/")
  # These targets log through evoked's logger on stderr (invalid records at
  # start, refused TCP calls: hundreds of MB in an hour): fd 2 is closed for
  # them, and libFuzzer and the sanitizers write their reports to a copy of it.
  case "$t" in
    fuzz_spill_record|fuzz_remote_record|fuzz_ring_service|fuzz_segment_open|fuzz_bearer_token)
      common+=(-close_fd_mask=2) ;;
  esac
  # shellcheck disable=SC2206
  extra=(${EVOKE_FUZZ_ARGS:-})

  # 1. Replay: every seed and every input that once crashed, once each.
  replay=("$corpus")
  if [ -d "$regressions" ]; then replay+=("$regressions"); fi
  if ! "$bin" "${common[@]}" -runs=0 "${replay[@]}" > "$log.replay" 2>&1; then
    echo "fuzz: $t FAILED replaying ${replay[*]} (log: $log.replay)" >&2
    tail -n 40 "$log.replay" >&2
    failed+=("$t")
    continue
  fi

  # 2. Fuzz for SECS seconds on a copy of the corpus.
  work=$(mktemp -d)
  cp -r "$corpus/." "$work/"
  rc=0
  "$bin" "${common[@]}" "${extra[@]}" -max_total_time="$SECS" "$work" > "$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1 || true)
  corpus_size=$(find "$work" -type f | wc -l)
  echo "fuzz: $t: ${SECS} s, ${execs:-?} executions, ${cov:-cov: ?}, corpus $corpus_size, rc $rc"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $t FAILED (log: $log; inputs: $OUT/$t/)" >&2
    grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY|Test unit written' "$log" | head -n 20 >&2 || true
    failed+=("$t")
  elif [ "${EVOKE_FUZZ_MERGE:-0}" = 1 ]; then
    "$bin" "${common[@]}" -merge=1 "$corpus" "$work" >> "$log" 2>&1
    echo "fuzz: $t: corpus now $(find "$corpus" -type f | wc -l) inputs"
  fi
  rm -rf "$work"
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets clean"
