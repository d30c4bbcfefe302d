#!/usr/bin/env bash
# bench-issue12.sh: issue #12's before/after, alternating, and the summary
# BENCHMARKS.md quotes (min / median / max over the rounds of each ratio).
#
#   scripts/bench-issue12.sh BEFORE_BUILD AFTER_BUILD OUT_DIR [ROUNDS] [-- BENCH_ARGS...]
#
# BEFORE_BUILD: a build dir of the "before" commit with evoked and evoke-bench
# built (e.g. a worktree of 808da34); AFTER_BUILD: this tree's. Each round
# runs, one after the other:
#   before-old  BEFORE's evoke-bench against BEFORE's evoked (the old bench:
#               each shared-memory region's first pass, page faults included)
#   before      AFTER's evoke-bench against BEFORE's evoked (steady state; the
#               old daemon has no ring, so the shm cases go by RPC and the ring
#               goal cases fail, loudly, as they should)
#   after       AFTER's evoke-bench against AFTER's evoked
# Default: 3 rounds of --quick, only the cases of issue #12's goals table
# (ONLY below; the old bench has no comma lists, so it runs once per part).
# Raw output: OUT_DIR/<variant>_<round>[_<part>].{txt,json}; the summary:
# OUT_DIR/summary.txt.
#
# Example:
#   git worktree add .before-bench 808da34
#   cmake -S .before-bench -B .before-bench/build-bench -G Ninja -DEVOKE_CUDA=OFF \
#     -DEVOKE_WITH_LLAMA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   ninja -C .before-bench/build-bench evoked evoke-bench
#   scripts/bench-issue12.sh .before-bench/build-bench build bench/results/issue12 3
set -uo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,25p "$0" >&2
  exit 2
fi
BEFORE=$(realpath "$1")
AFTER=$(realpath "$2")
OUT=$3
ROUNDS=${4:-3}
shift $(( $# >= 4 ? 4 : 3 ))
[ "${1:-}" = "--" ] && shift
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--quick)
mkdir -p "$OUT"
# The goals table's cases: shm 1M and 64K x 64 (ring and RPC), inline 16M,
# save+load shm 1M vs Redis (in 'shm 1M 1 1'), and the goal cases.
ONLY=${ONLY:-shm 1M 1 1,shm-rpc 1M 1 1,shm 64K 1 64,shm-rpc 64K 1 64,inline 16M 1 1,ops4k,lat4k,gather}
OLD_PARTS=("shm 1M 1 1" "shm 64K 1 64" "inline 16M 1 1")

run() {  # run NAME BENCH EVOKED ONLY
  local name=$1
  echo "== $name: $2 --evoked $3 ${ARGS[*]} --only '$4' (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  local start=$SECONDS
  "$2" --evoked "$3" "${ARGS[@]}" --only "$4" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc, $((SECONDS - start)) s (load after: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "# exit $rc, $((SECONDS - start)) s; load average before/after in run.log" >> "$OUT/$name.txt"
}

{
  echo "# scripts/bench-issue12.sh $BEFORE $AFTER $OUT $ROUNDS -- ${ARGS[*]}"
  echo "# $(date -u +%FT%TZ) $(nproc) cores; after: $(git -C "$AFTER/.." rev-parse --short HEAD 2>/dev/null)" \
    "before: $(git -C "$BEFORE/.." rev-parse --short HEAD 2>/dev/null)"
  for r in $(seq "$ROUNDS"); do
    i=0
    for part in "${OLD_PARTS[@]}"; do
      i=$((i + 1))
      run "before-old_${r}_$i" "$BEFORE/bench/evoke-bench" "$BEFORE/daemon/evoked" "$part"
    done
    run "before_$r" "$AFTER/bench/evoke-bench" "$BEFORE/daemon/evoked" "$ONLY"
    run "after_$r" "$AFTER/bench/evoke-bench" "$AFTER/daemon/evoked" "$ONLY"
  done
} 2>&1 | tee "$OUT/run.log"

python3 - "$OUT" "$ROUNDS" > "$OUT/summary.txt" <<'EOF'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
variants = ["before-old", "before", "after"]
data = {}  # (variant, key, field) -> [values]
for v in variants:
    for r in range(1, rounds + 1):
        for part in ["", "_1", "_2", "_3"]:
            path = os.path.join(out, f"{v}_{r}{part}.json")
            if not os.path.exists(path):
                continue
            j = json.load(open(path))
            for c in j.get("cases", []):
                key = (f"{c['op']} {c['path']} {c['block_bytes'] >> 10}K "
                       f"t{c['threads']} b{c['batch']}")
                for f in ("ratio_memcpy", "ratio_redis", "p50_us"):
                    if c.get(f) is not None:
                        data.setdefault((v, key, f), []).append(c[f])
            for g in j.get("goal_cases", []):
                data.setdefault((v, "goal " + g["name"], "ratio"), []).append(g["ratio"])
                data.setdefault((v, "goal " + g["name"], "value"), []).append(g["value"])
def spread(xs):
    if not xs:
        return "-"
    return f"{min(xs):.3g}/{statistics.median(xs):.3g}/{max(xs):.3g} (n={len(xs)})"
keys = []
for (v, k, f) in data:
    if (k, f) not in keys:
        keys.append((k, f))
print("# min/median/max over rounds; ratio_* are evoke / same-run baseline;")
print("# goal ratio = value / baseline_value (for latencies lower is better)")
print(f"{'case':38} {'field':12} " + " ".join(f"{v:>28}" for v in variants))
for k, f in keys:
    print(f"{k:38} {f:12} " + " ".join(f"{spread(data.get((v, k, f), [])):>28}" for v in variants))
EOF
cat "$OUT/summary.txt"
