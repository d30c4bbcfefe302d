#!/usr/bin/env bash
# models/evolkv.sh OUT_DIR [MEAN] [CONTEXT]: EvolKV per-layer budgets on the
# shipped model, and the comparison with uniform and PyramidKV plans.
#
# llama.cpp keeps one cache for all layers, so the plans are evaluated on the
# same weights in PyTorch with per-layer masks (models/layer_eval.py: a
# sliding window with 4 sinks per layer). evoke-tune searches on tuning
# sessions (evaluation split, seeds 1000-1015, multifact), disjoint from the
# held-out sessions the plans are compared on (seeds 0-29, every task). The
# fitness is graded: mean exact match over the tuning probes, times
# (1 + lambda * CacheScore) inside evoke-tune.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: evolkv.sh OUT_DIR [MEAN] [CONTEXT]}
MEAN=${2:-256}
CONTEXT=${3:-2048}
BUILD=${EVOKE_BUILD_DIR:-build}
MODEL=models/evoke-recall.gguf
mkdir -p "$OUT"
source models/train_env.sh
export PYTHONPATH="$PWD/$BUILD/_deps/llama.cpp/src/gguf-py"
LAYERS=$(/usr/bin/python3 -c "import sys; sys.path.insert(0, 'models'); from llama_model import load_gguf; print(load_gguf('$MODEL')[0].n_layer)")
EVAL="/usr/bin/python3 $PWD/models/layer_eval.py --model $PWD/$MODEL --taskgen $PWD/$BUILD/eval/evoke-taskgen --context $CONTEXT"
"$BUILD/tune/evoke-tune" --layers "$LAYERS" --target "$MEAN" --group-size "$LAYERS" \
  --min-budget 8 --max-budget $((4 * MEAN)) --population 10 --generations 8 --seed 1 \
  --timeout-s 600 \
  --fitness-cmd "$EVAL --tasks multifact --seeds 1000-1015 --plan -" \
  --out "$OUT/tuned.json" --trace "$OUT/trace.csv"
for plan in uniform pyramid "$OUT/tuned.json"; do
  name=$(basename "$plan" .json)
  $EVAL --tasks niah,multifact,agentic --seeds 0-29 --plan "$plan" --mean "$MEAN" \
    --json "$OUT/heldout-$name.json"
done
