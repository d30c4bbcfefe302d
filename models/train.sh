#!/usr/bin/env bash
# models/train.sh [RUN_DIR [train.py flags...]]: trains the shipped model from
# scratch on the CPU and exports it: models/evoke-recall.gguf, its reference
# logits (models/evoke-recall.ref), its SHA-256, and the loss curve
# (models/loss.svg). RUN_DIR (default /var/tmp/evoke-train/run) holds the
# checkpoints: run it again with the same RUN_DIR to resume after a stop.
# Hours on 2 cores: models/README.md says how many.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-/var/tmp/evoke-train/run}
shift || true
BUILD=${EVOKE_BUILD_DIR:-build}
scripts/setup-debian.sh
scripts/build.sh >/dev/null
source models/train_env.sh
/usr/bin/python3 models/train.py --taskgen "$BUILD/eval/evoke-taskgen" --ckpt-dir "$RUN" \
  --eval-sessions 32 "$@"
PYTHONPATH="$BUILD/_deps/llama.cpp/src/gguf-py" /usr/bin/python3 models/export_gguf.py \
  --ckpt "$RUN/latest.pt" --vocab "$RUN/vocab.txt" --out models/evoke-recall.gguf \
  --reference models/evoke-recall.ref --taskgen "$BUILD/eval/evoke-taskgen"
(cd models && sha256sum evoke-recall.gguf > evoke-recall.gguf.sha256)
/usr/bin/python3 models/plot_loss.py "$RUN/log.csv" models/loss.svg
cp "$RUN/log.csv" models/train-log.csv
"$BUILD/eval/evoke-model-check" --model models/evoke-recall.gguf --reference models/evoke-recall.ref
