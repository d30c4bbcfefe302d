#!/usr/bin/env bash
# device_check.sh: every GPU check of evoke, in one run on a GPU machine.
#
# Prepare here (a machine with the toolchain, nvcc and the Debian packages):
#   scripts/build.sh && gpu/make_device_carry.sh      # -> .device-carry/
# Run there, from the repository root (the device tool: carry .device-carry):
#   gpu/device_check.sh [OUT_DIR]
# It runs the GPU unit tests (device discovery, batched copies, CUDA IPC across
# processes, background host registration), the CUDA IPC end-to-end tests
# against a real evoked, and evoke-bench (quick set: inline, shared memory
# and CUDA IPC, with the in-process cudaMemcpyAsync baseline) plus the time to
# register an 8 GiB tier 1 with CUDA. Sized to finish in a few minutes on an
# H200 machine; prints a short summary and leaves logs and JSON in OUT_DIR.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-/tmp/evoke-device-out}}
mkdir -p "$OUT_DIR"
CARRY=${EVOKE_CARRY:-.device-carry}
export LD_LIBRARY_PATH="$PWD/$CARRY/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN="$PWD/$CARRY/bin"
export EVOKE_EVOKED="$BIN/evoked" EVOKE_EVOKECTL="$BIN/evokectl"
export EVOKE_IPC_EXPORTER="$BIN/ipc_exporter"
export TMPDIR=${TMPDIR:-/tmp}
summary=()
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  [ $rc -ne 0 ] && verdict="FAIL(rc=$rc)"
  summary+=("$(printf '%-22s %-12s %4ss' "$name" "$verdict" $((SECONDS - start)))")
  echo "== $name: $verdict"
  tail -n 25 "$OUT_DIR/$name.log"
}

# EVOKE_DEVICE_STEPS picks steps (default all): tests bench headline.
STEPS=${EVOKE_DEVICE_STEPS:-tests bench headline}
step() { [[ " $STEPS " == *" $1 "* ]]; }

nvidia-smi -L 2>&1 | tee "$OUT_DIR/nvidia-smi.log"
if step tests; then
  run gpu_test 120 "$BIN/gpu_test"
  run cuda_ipc_test 180 "$BIN/cuda_ipc_test"
  run cuda_e2e_test 300 "$BIN/cuda_e2e_test"
fi
if step bench; then
  # EVOKE_BENCH_ONLY=cuda limits the benchmark to the CUDA cases.
  run evoke_bench 420 "$BIN/evoke-bench" --quick --evoked "$BIN/evoked" \
    --case-mib 256 --register-probe 8GiB --json "$OUT_DIR/bench_gpu.json" \
    ${EVOKE_BENCH_ONLY:+--only "$EVOKE_BENCH_ONLY"}
fi
if step headline; then
# The headline of issue #4: save + re-anchored load of 2048 tokens of
# Llama-3.1-8B-shaped KV (256 MiB) against re-prefilling them with PyTorch.
# evoked logs each call's phases at debug level (headline_evoked.log).
run headline 300 "$BIN/evoke-bench" --evoked "$BIN/evoked" --headline 2048 \
  --json "$OUT_DIR/headline.json" --evoked-arg=--log-level=debug \
  --evoked-log "$OUT_DIR/headline_evoked.log" ${EVOKE_HEADLINE_ARGS:-}
run prefill 300 python3 gpu/prefill_baseline.py --tokens 2048 --runs 7
grep '^{' "$OUT_DIR/prefill.log" | tail -1 > "$OUT_DIR/prefill.json"
tail -n 40 "$OUT_DIR/headline_evoked.log" 2>/dev/null
python3 - "$OUT_DIR" <<'PY' | tee "$OUT_DIR/headline.txt"
import json, sys
out = sys.argv[1]
try:
    h = json.load(open(out + "/headline.json"))
    p = json.load(open(out + "/prefill.json"))
except Exception as e:
    print("headline: no result (%s)" % e)
    sys.exit(0)
pre = p["prefill_ms_median"]
print("headline: 2048 tokens, %d MiB of KV: re-prefill %.2f ms (PyTorch, %s); "
      "save %.2f ms, load re-anchored %.2f ms" % (h["kv_bytes"] >> 20, pre, p["gpu"],
                                                   h["save_ms"], h["load_ms"]))
print("headline: save+load is %.2fx faster than re-prefill (target 5x); load alone %.2fx "
      "(target 10x)" % (pre / h["save_load_ms"], pre / h["load_ms"]))
if "memcpy_d2h_ms" in h:
    floor = h["memcpy_d2h_ms"] + h["memcpy_h2d_ms"]
    print("headline: bound by PCIe: bare cudaMemcpy of the same bytes (%.2f + %.2f ms) would be "
          "%.2fx save+load, %.2fx load" % (h["memcpy_d2h_ms"], h["memcpy_h2d_ms"], pre / floor,
                                           pre / h["memcpy_h2d_ms"]))
PY
fi

echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$OUT_DIR/summary.txt"
grep -E "^(op|save|load).* cuda " "$OUT_DIR/evoke_bench.log" | tee -a "$OUT_DIR/summary.txt"
grep -E "cuda registration" "$OUT_DIR/evoke_bench.log" | tee -a "$OUT_DIR/summary.txt"
grep -E "^headline" "$OUT_DIR/headline.txt" "$OUT_DIR/headline.log" 2>/dev/null | tee -a "$OUT_DIR/summary.txt"
grep -q FAIL "$OUT_DIR/summary.txt" && exit 1
exit 0
