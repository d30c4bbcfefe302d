#!/usr/bin/env bash
# models/train.sh [RUN_DIR [train.py flags...]]: trains the shipped model from
# scratch on the CPU and exports it: models/evoke-recall.gguf, its reference
# logits (models/evoke-recall.ref), its SHA-256, and the loss curve
# (models/loss.svg). RUN_DIR (default /var/tmp/evoke-train/run) holds the
# checkpoints: run it again with the same RUN_DIR to resume after a stop.
# With no train.py flags it trains the shipped recipe (run K of
# models/README.md: bind drills, then the curriculum up to 2,048 tokens; 8
# query / 4 KV heads with query/key biases, seed 4): 31.5M tokens, about 3.5
# hours of training time on 2 cores. Flags after RUN_DIR replace the recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-/var/tmp/evoke-train/run}
shift || true
BUILD=${EVOKE_BUILD_DIR:-build}
scripts/setup-debian.sh
scripts/build.sh >/dev/null
source models/train_env.sh
if [ $# -eq 0 ]; then
  set -- --seed 4 --config '{"n_head": 8, "n_head_kv": 4, "qk_bias": true}' \
    --stages 128:32:3000:bind1+bind2+recall,128:32:6000:recall,256:16:3000,512:8:3000,1024:4:3000,2048:2:3000
fi
/usr/bin/python3 models/train.py --taskgen "$BUILD/eval/evoke-taskgen" --ckpt-dir "$RUN" \
  --eval-sessions 32 "$@"
PYTHONPATH="$BUILD/_deps/llama.cpp/src/gguf-py" /usr/bin/python3 models/export_gguf.py \
  --ckpt "$RUN/latest.pt" --vocab "$RUN/vocab.txt" --out models/evoke-recall.gguf \
  --reference models/evoke-recall.ref --taskgen "$BUILD/eval/evoke-taskgen"
(cd models && sha256sum evoke-recall.gguf > evoke-recall.gguf.sha256)
/usr/bin/python3 models/plot_loss.py "$RUN/log.csv" models/loss.svg
cp "$RUN/log.csv" models/train-log.csv
"$BUILD/eval/evoke-model-check" --model models/evoke-recall.gguf --reference models/evoke-recall.ref
