#!/usr/bin/env bash
# measure-kv-compression.sh: how well real KV bytes compress (issue #27).
#
#   scripts/measure-kv-compression.sh [BUILD] [DIR]
#
# Runs evoke-eval on the shipped model (models/evoke-recall.gguf: the
# multifact and niah tasks, EVOKE policy, budget 512, seeds 1-4) against an
# evoked whose tier 1 is 1 MiB, so that the evicted KV blocks spill to
# segment files; copies the segment files while the eval runs (the eval
# deletes its blocks at the end of each session), extracts every payload
# record from them (the blocks' K and V bytes as the engine saved them), and
# runs the zstd and lz4 command-line benchmarks on those bytes in 64 KiB
# independent chunks (one block each), and on as many random bytes. Needs
# zstd, lz4 and python3.
set -euo pipefail
BUILD=${1:-build} D=${2:-/var/tmp/evoke-kv-compression}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$D"; mkdir -p "$D/snap"
"$BUILD/daemon/evoked" --socket "$D/e.sock" --data-dir "$D/data" --pinned-bytes 1MiB \
  --lock-memory false --metrics-address "" > "$D/evoked.log" 2>&1 &
EV=$!
trap 'kill $EV 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$D/e.sock" ] && break; sleep 0.1; done
( "$BUILD/eval/evoke-eval" --model "$ROOT/models/evoke-recall.gguf" --tasks multifact niah \
    --policies evoke --budgets 512 --seeds 1-4 --context 2048 --evoked "$D/e.sock" \
    > "$D/eval.log" 2>&1; touch "$D/done" ) &
while [ ! -f "$D/done" ]; do
  cp -u "$D"/data/segments/*.evs "$D/snap/" 2>/dev/null || true
  sleep 0.05
done
python3 - "$D" <<'PY'
import glob, struct, sys
d = sys.argv[1]
n = total = 0
with open(d + "/payloads.bin", "wb") as out:
    for f in sorted(glob.glob(d + "/snap/*.evs")):
        b = open(f, "rb").read()
        off = 4096  # The file header; then 64-byte record headers (segment_log_impl.h).
        while off + 64 <= len(b) and b[off:off + 4] == b"EVR2":
            typ = struct.unpack_from("<H", b, off + 4)[0]
            length = struct.unpack_from("<Q", b, off + 32)[0]
            if typ == 1 and length > 0:  # A payload record.
                out.write(b[off + 64:off + 64 + length])
                n += 1
                total += length
            off += 64 + (length + 63) // 64 * 64
print(f"{n} payloads, {total} bytes of KV")
PY
head -c "$(stat -c %s "$D/payloads.bin")" /dev/urandom > "$D/random.bin"
for f in payloads random; do
  for lvl in 1 3; do zstd -b$lvl -B64KiB "$D/$f.bin" 2>&1 | tr '\r' '\n' | grep 'MB/s' | tail -1; done
  lz4 -b1 -B4 "$D/$f.bin" 2>&1 | tr '\r' '\n' | grep 'MB/s' | tail -1
done
