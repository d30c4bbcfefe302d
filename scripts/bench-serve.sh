#!/usr/bin/env bash
# bench-serve.sh: time to first token of a returning conversation after a
# restart of evoke-serve (issue #29): its blocks loaded from evoked, against
# the same engine prefilling it again (--no-save-prefixes), in the same run.
#
#   scripts/bench-serve.sh [TOKENS] [ROUNDS]     (default 4000 tokens, 5 rounds)
#
# A round: start evoke-serve (and its evoked), send the conversation once
# with max_tokens 1 (the engine writes it through to evoked), restart
# evoke-serve and its evoked, send it again and time it (curl's total time
# of a max_tokens 1 request: tokenize, load or prefill, one token). Prints
# the medians and their ratio. Model: models/evoke-recall.gguf (trained to
# 2,048 tokens, declares 4,096; the timing does not depend on the answer).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN="$ROOT/${EVOKE_BUILD_DIR:-build}/serve/evoke-serve"
TOKENS=${1:-4000}
ROUNDS=${2:-5}
WORK=$(mktemp -d)
LLAMA_SERVER=${LLAMA_SERVER:-$ROOT/build-llama-server/bin/llama-server}
trap 'pkill -f "evoke-serve --port 18190" 2>/dev/null || true; pkill -f "llama-server -m .* --port 18191" 2>/dev/null || true; rm -rf "$WORK"' EXIT
# A conversation in the model's language: ~10 tokens a fact.
prompt=""
i=0
words=(red blue green amber bronze ivory)
animals=(fox cat whale ant squid owl)
while [ $(( i * 10 )) -lt "$TOKENS" ]; do
  prompt+="the code for ${words[$((i % 6))]} ${animals[$(((i / 6) % 6))]} is $((i % 10)) $(((i / 10) % 10)) $(((i / 100) % 10)) . "
  i=$((i + 1))
done
prompt+="question : what is the code for red fox ? answer :"
body=$(printf '{"model":"evoke-recall","prompt":"%s","max_tokens":1,"temperature":0}' "$prompt")

# Waits for PORT's /health (the server's log, LOG, on failure); kills by
# PATTERN; times a max_tokens 1 request to PORT into OUT.
await_health() {
  for _ in $(seq 1 300); do
    curl -sf "localhost:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$2" >&2
  return 1
}
stop_all() { pkill -TERM -f "$1" || true; while pgrep -f "$1" >/dev/null; do sleep 0.1; done; }
time_request() {
  curl -s -o "$2" -w '%{time_total}' "localhost:$1/v1/completions" \
    -H 'Content-Type: application/json' -d "$body"
}

start() {  # $1: data dir, rest: flags
  local dir=$1; shift
  "$BIN" --port 18190 --data-dir "$dir" --kv-budget $(( TOKENS + 512 )) --slots 1 "$@" \
    >"$WORK/serve.log" 2>&1 &
  await_health 18190 "$WORK/serve.log"
}
stop() { stop_all "evoke-serve --port 18190"; }
timed() { time_request 18190 "$WORK/out.json"; }

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The "cached_tokens" of a response.
cached_of() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"])' "$1"
}

run() {  # $1: label, rest: flags
  local label=$1; shift
  local times=()
  for r in $(seq 1 "$ROUNDS"); do
    rm -rf "$WORK/data"
    start "$WORK/data" "$@"; timed >/dev/null; stop
    start "$WORK/data" "$@"; t=$(timed); stop
    prompt_tokens=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$WORK/out.json")
    times+=("$t")
    echo "$label round $r: ${t} s, $(cached_of "$WORK/out.json") of ${prompt_tokens} prompt tokens not computed" >&2
  done
  printf '%s\n' "${times[@]}" | median
}

ls_start() {
  "$LLAMA_SERVER" -m "$ROOT/models/evoke-recall.gguf" --port 18191 -c $(( TOKENS + 512 )) -np 1 \
    -fa off -ctk f16 -ctv f16 --slot-save-path "$WORK/slots/" --no-webui >"$WORK/ls.log" 2>&1 &
  await_health 18191 "$WORK/ls.log"
}
ls_stop() { stop_all "llama-server -m .* --port 18191"; }
ls_timed() { time_request 18191 "$WORK/ls.json"; }
ls_slot() {  # $1: save or restore; prints its time
  curl -s -o /dev/null -w '%{time_total}' -X POST "localhost:18191/slots/0?action=$1" \
    -H 'Content-Type: application/json' -d '{"filename":"conversation.bin"}'
}
ls_run() {  # $1: restore or prefill
  local times=()
  for r in $(seq 1 "$ROUNDS"); do
    rm -rf "$WORK/slots"; mkdir -p "$WORK/slots"
    ls_start; ls_timed >/dev/null; ls_slot save >/dev/null; ls_stop
    ls_start
    local t=0
    if [ "$1" = restore ]; then t=$(ls_slot restore); fi
    t=$(python3 -c "print($t + $(ls_timed))")
    ls_stop
    times+=("$t")
    echo "llama-server $1 round $r: ${t} s, $(cached_of "$WORK/ls.json") prompt tokens cached" >&2
  done
  printf '%s\n' "${times[@]}" | median
}

evoke=$(run evoke)
prefill=$(run re-prefill --no-save-prefixes)
echo "tokens ~$TOKENS, rounds $ROUNDS: returning conversation after a restart, median time to first token: evoke ${evoke} s, re-prefill ${prefill} s, ratio $(python3 -c "print(round($prefill/$evoke, 2))")x"
if [ -x "$LLAMA_SERVER" ]; then
  ls_restore=$(ls_run restore)
  ls_prefill=$(ls_run prefill)
  echo "llama-server, same run: slot restore + request ${ls_restore} s, re-prefill ${ls_prefill} s; evoke-serve / llama-server restore: $(python3 -c "print(round($evoke/$ls_restore, 2))")x the time"
else
  echo "llama-server: not built (scripts/build-llama-server.sh), not compared"
fi
