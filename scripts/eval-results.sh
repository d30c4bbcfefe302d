#!/usr/bin/env bash
# eval-results.sh [OUT_DIR]: regenerates every figure of RESULTS.md's
# "trained model" sections from models/evoke-recall.gguf (default OUT_DIR:
# eval/results). Each step writes JSON (and a chart) with the command that
# made it; steps whose output exists are skipped, so a stopped run resumes.
#   1. the model's own quality: full context, no eviction, 200 sessions of
#      each task at 4,096 tokens;
#   2. the main table: every policy at budgets 512 and 1,024 on 4,096-token
#      sessions, and 2,048 on 8,192-token ones (each context 4x its budget),
#      30 sessions a cell;
#   3. per-layer budgets on the same weights (models/evolkv.sh): EvolKV
#      tuned vs uniform vs PyramidKV on held-out sessions.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-eval/results}
BUILD=${EVOKE_BUILD_DIR:-build}
MODEL=models/evoke-recall.gguf
EVAL="$BUILD/eval/evoke-eval --model $MODEL --jobs 2"
POLICIES=full,recency,streaming_llm,h2o,snapkv,infllm,evoke
mkdir -p "$OUT"
step() {  # step NAME COMMAND...: runs COMMAND unless OUT/NAME.json exists
  local name=$1; shift
  if [ -f "$OUT/$name.json" ]; then echo "eval-results: $name done"; return; fi
  echo "eval-results: $name: $*"
  local t0=$SECONDS
  "$@" > "$OUT/$name.md"
  echo "eval-results: $name took $((SECONDS - t0)) s" | tee -a "$OUT/timing.txt"
}
step quality $EVAL --tasks niah,multifact,agentic --policies full --seeds 0-199 \
  --context 4096 --json "$OUT/quality.json"
step main-4096 $EVAL --tasks niah,multifact,agentic --policies $POLICIES --budgets 512,1024 \
  --seeds 0-29 --context 4096 --json "$OUT/main-4096.json" --chart "$OUT/main-4096.svg"
step main-8192 $EVAL --tasks niah,multifact,agentic --policies $POLICIES --budgets 2048 \
  --seeds 0-29 --context 8192 --json "$OUT/main-8192.json" --chart "$OUT/main-8192.svg"
if [ ! -f "$OUT/evolkv/heldout-tuned.json" ]; then
  t0=$SECONDS
  models/evolkv.sh "$OUT/evolkv" 256 2048
  echo "eval-results: evolkv took $((SECONDS - t0)) s" | tee -a "$OUT/timing.txt"
fi
