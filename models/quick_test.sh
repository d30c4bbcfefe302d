#!/usr/bin/env bash
# models/quick_test.sh BUILD_DIR: the training pipeline end to end, small.
# Trains a tiny model for a minute (train.py --quick, which fails unless the
# loss fell by 20%), exports it to GGUF with reference logits, and checks
# that llama.cpp loads it and computes the same logits (evoke-model-check).
# It says nothing about the shipped model's quality: see models/README.md.
set -euo pipefail
BUILD=$(cd "${1:?usage: quick_test.sh BUILD_DIR}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
source "$HERE/train_env.sh"
# With q/k biases (llama_model.qk_bias), so that their export and llama.cpp's
# loading of them are checked too.
/usr/bin/python3 "$HERE/train.py" --quick --taskgen "$BUILD/eval/evoke-taskgen" --ckpt-dir "$WORK/run" \
  --config '{"qk_bias": true}'
PYTHONPATH="$BUILD/_deps/llama.cpp/src/gguf-py" /usr/bin/python3 "$HERE/export_gguf.py" \
  --ckpt "$WORK/run/latest.pt" --vocab "$WORK/run/vocab.txt" --out "$WORK/quick.gguf" \
  --reference "$WORK/quick.ref" --taskgen "$BUILD/eval/evoke-taskgen" --ref-length 256
"$BUILD/eval/evoke-model-check" --model "$WORK/quick.gguf" --reference "$WORK/quick.ref"

# One --quick evoke-eval cell on the tiny model, through a real evoked: the
# evaluation pipeline runs and its JSON accounts for every probe.
"$BUILD/eval/evoke-eval" --model "$WORK/quick.gguf" --tasks multifact --policies full,recency,evoke \
  --budgets 256 --seeds 0-1 --quick --json "$WORK/eval.json" --chart "$WORK/eval.svg"
/usr/bin/python3 - "$WORK/eval.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
cells = d["cells"]
assert [c["policy"] for c in cells] == ["full", "recency", "evoke"], cells
for c in cells:
    assert c["sessions"] == 2 and c["n"] >= 2 and c["errors"] == 0, c
    assert 0 <= c["passes"] <= c["n"], c
    lo, hi = c["wilson_sessions"]
    assert 0 <= lo <= c["session_mean"] <= hi <= 1, c
ev = cells[2]
assert ev["blocks_saved"] > 0, "a 1024-token session under a 256-token budget must evict"
assert sum(ev["fact_rank"].values()) == ev["n"], ev
print("evoke-eval quick cell: ok", [(c["policy"], c["passes"], c["n"]) for c in cells])
PY
