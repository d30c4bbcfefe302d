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
#   8. evoke-serve on the trained model: a fact asked over the OpenAI API,
#      then asked again after evoke-serve restarts (its blocks from evoked);
#   9. evokectl stat and verify.
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
if [ -x "$BIN/serve/evoke-serve" ]; then
  echo "== evoke-serve: the trained model over the OpenAI API, conversations kept in evoked"
  SERVE_PORT=${EVOKE_DEMO_SERVE_PORT:-18080}
  fact='the code for red fox is 4 2 7 . the code for blue cat is 9 1 3 . question : what is the code for red fox ? answer :'
  body="{\"model\": \"evoke-recall\", \"prompt\": \"$fact\", \"max_tokens\": 4, \"temperature\": 0}"
  ask() {  # One completion; prints its text and how much of the prompt was not computed.
    curl -s "localhost:$SERVE_PORT/v1/completions" -H 'Content-Type: application/json' -d "$body" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print("   answer:%s  (%d of %d prompt tokens not computed)" % (r["choices"][0]["text"], r["usage"]["prompt_tokens_details"]["cached_tokens"], r["usage"]["prompt_tokens"]))'
  }
  serve() {
    "$BIN/serve/evoke-serve" --socket "$DEMO_DIR/evoked.sock" --port "$SERVE_PORT" --block-tokens 8 \
      >>evoke-serve.log 2>&1 &
    serve_pid=$!
    for _ in $(seq 1 100); do curl -sf "localhost:$SERVE_PORT/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
    cat evoke-serve.log; return 1
  }
  serve
  echo "   first time:"; ask
  kill -TERM "$serve_pid"; wait "$serve_pid"
  echo "   evoke-serve restarted; the same conversation again (its blocks from evoked):"
  serve
  ask
  kill -TERM "$serve_pid"; wait "$serve_pid"
fi
echo "== evokectl stat"
"$BIN/tools/evokectl/evokectl" stat
echo "== evokectl verify"
"$BIN/tools/evokectl/evokectl" verify
stop_evoked
echo "== demo finished: data left in $DEMO_DIR"
