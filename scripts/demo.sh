#!/usr/bin/env bash
# demo.sh: installs what is missing, builds, and runs the main job: evoked
# with its embedded default configuration (1 GiB tier 1, 16 GiB spill budget,
# socket ./evoked.sock, data in ./evoke-data, all inside $EVOKE_DEMO_DIR) and a
# short demonstration against it:
#   1. evoke-demo save: more blocks than tier 1 holds; the coldest spill;
#   2. SIGTERM: evoked flushes tier 1 to RocksDB and exits 0;
#   3. evoked restarts and rebuilds its index from disk;
#   4. evoke-demo load: every block back, byte-identical; a reader with
#      another layout fingerprint refused;
#   5. evoke-demo splice: an agent session whose early blocks were evicted;
#      a query recovers the right ones by key similarity, and the best one is
#      loaded at the end of the context with K re-anchored (checked against K
#      computed directly at the new positions), V byte-identical;
#   6. evoke-llama-demo: the real llama.cpp (random-weight Llama) evicts a
#      range to evoked and restores it (next-token logits bitwise equal to a
#      context that never evicted), then splices it at the tail;
#   7. evoke-sim: the synthetic simulator (no language model) compares
#      StreamingLLM with EVOKE on the multi-fact task at a 1024-token budget;
#      EVOKE's evicted blocks go through a second evoked that the simulator
#      starts (saved, spilled, ranked by Recover, loaded re-anchored, checked);
#   8. evokectl stat and verify.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
scripts/setup-debian.sh
scripts/build.sh >/dev/null
BIN="$ROOT/${EVOKE_BUILD_DIR:-build}"
DEMO_DIR=${EVOKE_DEMO_DIR:-$ROOT/demo-run}
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
cd "$DEMO_DIR"

pid=""
cleanup() { if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi; }
trap cleanup EXIT

start_evoked() {
  "$BIN/daemon/evoked" 2>>evoked.log &
  pid=$!
  # Up to 60 s: evokectl fails at once while the socket does not exist yet.
  for _ in $(seq 1 600); do
    if "$BIN/tools/evokectl/evokectl" health --timeout 1 >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then cat evoked.log; echo "demo: evoked exited" >&2; exit 1; fi
    sleep 0.1
  done
  cat evoked.log; echo "demo: evoked did not become healthy" >&2; exit 1
}

stop_evoked() {
  kill -TERM "$pid"
  local code=0
  wait "$pid" || code=$?
  pid=""
  echo "== evoked exited with status $code after SIGTERM"
  [ "$code" -eq 0 ]
}

echo "== starting evoked with its embedded defaults in $DEMO_DIR"
"$BIN/daemon/evoked" --print-config | sed 's/^/   /'
start_evoked
tail -n +1 evoked.log | sed 's/^/   /'
echo "== evoke-demo save"
"$BIN/client/evoke-demo" save
echo "== evokectl stat (before restart)"
"$BIN/tools/evokectl/evokectl" stat
echo "== SIGTERM: evoked flushes tier 1 to disk"
stop_evoked
grep -E "received|shut down" evoked.log | sed 's/^/   /'
echo "== restarting evoked"
start_evoked
grep -E "recovered" evoked.log | tail -1 | sed 's/^/   /'
echo "== evoke-demo load"
"$BIN/client/evoke-demo" load
echo "== evoke-demo splice"
"$BIN/client/evoke-demo" splice
if [ -x "$BIN/engines/llama/evoke-llama-demo" ]; then
  echo "== evoke-llama-demo"
  "$BIN/engines/llama/evoke-llama-demo"
fi
if [ -x "$BIN/sim/evoke-sim" ]; then
  echo "== evoke-sim: multi-fact, budget 1024 tokens, 3 seeds (synthetic: no language model)"
  "$BIN/sim/evoke-sim" --tasks multifact --policies streaming_llm,evoke --budgets 1024 \
    --seeds 3 --threads 2 --out-dir sim >/dev/null
  grep -A5 "pass rate" sim/results.md | sed 's/^/   /'
  sed -n '/engine+evoked/,/^$/p' sim/timing.md 2>/dev/null | sed 's/^/   /' || true
fi
echo "== evokectl stat"
"$BIN/tools/evokectl/evokectl" stat
echo "== evokectl verify"
"$BIN/tools/evokectl/evokectl" verify
stop_evoked
echo "== demo finished: data left in $DEMO_DIR"
