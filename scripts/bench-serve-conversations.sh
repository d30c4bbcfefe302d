#!/usr/bin/env bash
# Concurrent conversations under a KV budget a quarter of their context:
# evoke-serve (its policy evicting to evoked and recovering) against
# llama.cpp's llama-server given the same cells, with the same clients
# (scripts/serve-conversations.py: generated evaluation sessions of the
# trained model, graded by exact match).
#
#   scripts/bench-serve-conversations.sh [SECONDS] [CLIENTS] [TARGETS]
#
# Defaults: 300 s, 8 clients, "evoke-serve llama-server". Conversations are
# 2,048 tokens; the budget is CLIENTS x 2,048 / 4 cells (8 clients: 4,096,
# 512 a slot). llama-server runs with a unified KV cache of those cells (a
# slot may take all of it while others are idle) and is built by
# scripts/build-llama-server.sh from the same pinned llama.cpp. Results:
# bench/results/issue29_conversations/<target>.json (summary and every
# request).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_RUN=${1:-300}
CLIENTS=${2:-8}
TARGETS=${3:-"evoke-serve llama-server"}
BUDGET=$(( CLIENTS * 2048 / 4 ))
OUT=$ROOT/bench/results/issue29_conversations
WORK=$(mktemp -d)
mkdir -p "$OUT"
trap 'pkill -f "evoke-serve --port 18290" 2>/dev/null || true; pkill -f "llama-server -m .* --port 18291" 2>/dev/null || true; rm -rf "$WORK"' EXIT

await_health() {  # $1: port, $2: log
  for _ in $(seq 1 120); do
    curl -sf "localhost:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "no server on port $1:" >&2; tail -20 "$2" >&2; exit 1
}

clients() {  # $1: port, $2: target, rest: flags
  local port=$1 target=$2; shift 2
  python3 "$ROOT/scripts/serve-conversations.py" --url "http://127.0.0.1:$port" "$@" \
    --clients "$CLIENTS" --duration "$SECONDS_RUN" --length 2048 --sessions 400 \
    --first-seed 1000 --taskgen "$ROOT/build/eval/evoke-taskgen" --json "$OUT/$target.json"
}

for target in $TARGETS; do
  case $target in
    evoke-serve)
      "$ROOT/build/serve/evoke-serve" --port 18290 --slots "$CLIENTS" --kv-budget "$BUDGET" \
        --threads 2 --data-dir "$WORK/evoke" >"$WORK/evoke.log" 2>&1 &
      await_health 18290 "$WORK/evoke.log"
      clients 18290 evoke-serve
      curl -s localhost:18290/metrics | grep -E '^evoke_serve_(policy|prompt|failed)' || true
      pkill -f "evoke-serve --port 18290"; sleep 1
      ;;
    llama-server)
      "$ROOT/build-llama-server/bin/llama-server" -m "$ROOT/models/evoke-recall.gguf" \
        --port 18291 -c "$BUDGET" -np "$CLIENTS" -kvu -t 2 -fa off -ctk f16 -ctv f16 \
        --no-webui >"$WORK/llama-server.log" 2>&1 &
      await_health 18291 "$WORK/llama-server.log"
      # The trained model's GGUF has a WordPiece-typed vocabulary, for which
      # llama.cpp appends the separator (</s>) to every text prompt; the
      # prompts go as token ids instead (BOS and the text's tokens, as
      # evoke-serve tokenizes them).
      clients 18291 llama-server --token-prompts 1
      pkill -f "llama-server -m .* --port 18291"; sleep 1
      ;;
    *) echo "unknown target $target" >&2; exit 2 ;;
  esac
done
