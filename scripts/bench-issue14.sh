#!/usr/bin/env bash
# bench-issue14.sh: issue #14's measurements of tier 3 (Ceph RADOS), each
# beside its same-run baseline on one throwaway cluster, and the summary
# (median, min and max of each ratio over the rounds).
#
#   scripts/bench-issue14.sh BUILD OUT_DIR [RUNS]
#
# BUILD: a build dir with evoke-remote-bench and evoked built (cmake --build
# BUILD --target evoke-remote-bench evoked). OUT_DIR: where the raw output
# goes (e.g. bench/results/issue14); RUNS: rounds, default 3. Starts its own
# cluster with scripts/ceph-dev-cluster.sh (1 mon, 1 mgr, 3 memstore OSDs on
# loopback, pool `evoke` size 3 / min_size 2) in a temp dir and always stops
# it. Root is needed for the cold tier-2 case (it drops the page cache).
# Environment:
#   BLOCKS="1MiB 4MiB"   block sizes of the throughput cases
#   TOTAL=256MiB         payload written behind (and fetched) per case
#   LOAD_BLOCKS=16       blocks per Load on the fetching host
#   VARIANT_INFLIGHT=32  a second write-behind/fetch case with this
#                        --remote-inflight (empty: none); the first uses 16
#   RADOS_SECS=10        seconds of each `rados bench`
#   REUSE_BLOCK_TOKENS="16 256"  block sizes (tokens) of the 2,048-token prefix
#   SAVES=2000           timed Saves of 1 MiB per Save-latency case
#   MEMSTORE_BYTES       RAM cap of each OSD (default 4 GiB here)
#   CASES="throughput reuse saves"  which cases run
#   LOAD_PATH=shm        how host B's Loads return bytes: shm (LoadInto a
#                        shared region, the engines' path) or inline (gRPC)
#   QUEUED=1             throughput: the OSDs are stopped (SIGSTOP) while host A
#                        saves and continued after, so that the write-behind
#                        starts with the whole set queued (queued_MBps: its own
#                        rate, local Save speed out of it); 0: not
#   scripts/bench-issue14.sh --summary OUT_DIR  rewrites OUT_DIR/summary.txt from
#                        OUT_DIR/raw.txt
# Each round (the order of evoke and baseline flips every round):
#   per block size B:
#     rados bench RADOS_SECS write -t 16 -b B --no-cleanup   (baseline)
#     rados bench RADOS_SECS seq -t 16   (reads what the write bench wrote)
#     rados cleanup
#     evoke-remote-bench throughput --block-bytes B --inflight 16
#       (host A: write-behind of TOTAL; host B: fetch, LOAD_BLOCKS per Load)
#     the same with --inflight VARIANT_INFLIGHT
#   per REUSE_BLOCK_TOKENS: evoke-remote-bench reuse --source remote, then
#     --source tier2 --drop-caches (cold) and --source tier2 (page cache warm)
#   evoke-remote-bench saves (no remote tier) and saves --remote
# Every evoke case writes into its own RADOS namespace, removed afterwards.
# Raw output: OUT_DIR/raw.txt (command lines, rados bench's own output,
# RESULT and RADOS lines, uptime); the summary: OUT_DIR/summary.txt.
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,45p "$0" >&2
  exit 2
fi
SUMMARY_ONLY=0
if [ "$1" = --summary ]; then
  SUMMARY_ONLY=1
  OUT=$2
  RAW=$OUT/raw.txt
fi
summarize() {
python3 - "$RAW" > "$OUT/summary.txt" <<'EOF'
import re, statistics, sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith(("RESULT ", "RADOS ")):
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        kv["kind"] = line.split()[0]
        rows.append(kv)
def find(kind, **want):
    return [r for r in rows if r["kind"] == kind and all(r.get(k) == str(v) for k, v in want.items())]
def stats(xs, f="%.2f"):
    if not xs: return "n/a"
    return (f + " (min " + f + ", max " + f + ", n=%d)") % (statistics.median(xs), min(xs), max(xs), len(xs))
def med(xs, f="%.0f"):
    return f % statistics.median(xs) if xs else "n/a"
def size(b):
    b = int(b)
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10)
runs = sorted({r["run"] for r in rows}, key=int)
blocks = []
for r in rows:
    if r["kind"] == "RADOS" and r["block_bytes"] not in blocks: blocks.append(r["block_bytes"])

print("1. Throughput (MB/s = 1e6 B/s; ratio = evoke / rados bench of the same round; goal >= 0.8)")
print("%-44s %10s %10s   %-34s %s" % ("case", "evoke", "rados", "ratio per run: median (min, max, n)", "goal"))
for b in blocks:
    for inflight in sorted({r["inflight"] for r in rows if r["kind"] == "RESULT" and r.get("case") in ("write", "fetch")}, key=int):
        for case, base, label, key in (("write", "write", "write-behind, queued", "queued_MBps"),
                                       ("write", "write", "first Save to drained", "MBps"),
                                       ("fetch", "seq", "fetch", "MBps")):
            ev, ba, ratio = [], [], []
            for run in runs:
                e = find("RESULT", run=run, case=case, block_bytes=b, inflight=inflight)
                d = find("RADOS", run=run, case=base, block_bytes=b)
                if e and d and "MBps" in d[0] and key in e[0]:
                    ev.append(float(e[0][key])); ba.append(float(d[0]["MBps"]))
                    ratio.append(ev[-1] / ba[-1])
            if not ev: continue
            met = "met" if statistics.median(ratio) >= 0.8 else "NOT met"
            print("%-44s %10s %10s   %-34s %s" % ("%s %s inflight %s" % (label, size(b), inflight),
                  med(ev), med(ba), stats(ratio), met))
    for inflight in sorted({r["inflight"] for r in rows if r["kind"] == "RESULT" and r.get("case") == "write"}, key=int):
        w = find("RESULT", case="write", block_bytes=b, inflight=inflight)
        f = find("RESULT", case="fetch", block_bytes=b, inflight=inflight)
        print("    %s inflight %s: Saves acked at %s MB/s (save_s %s); deepest queue %s blocks; "
              "first Load of %s blocks %s ms; dropped %d, wrong %d, not from RADOS %d" % (
              size(b), inflight,
              med([int(r["bytes"]) / float(r["save_s"]) / 1e6 for r in w]),
              med([float(r["save_s"]) for r in w], "%.2f"),
              med([int(r["max_queue_blocks"]) for r in w]),
              f[0]["load_blocks"] if f else "?", med([float(r["first_load_ms"]) for r in f], "%.1f"),
              sum(int(r["dropped"]) for r in w), sum(int(r["wrong"]) for r in f),
              sum(int(r["not_remote"]) for r in f)))
        if f and "reload_MBps" in f[0]:
            print("    %s inflight %s: the same Loads again from host B's tier 1: %s MB/s "
                  "(fetch time / reload time: %s)" % (size(b), inflight,
                  med([float(r["reload_MBps"]) for r in f]),
                  stats([float(r["load_s"]) / float(r["reload_s"]) for r in f])))
print()
print("2. Cross-host prefix reuse: 2,048-token Llama-3.1-8B prefix (256 MiB) on host B, ms from")
print("   the start of the fleet-wide Lookup (median over runs; min-max)")
print("%-12s %-12s %18s %22s %22s %10s %s" % ("block", "source", "Lookup ms", "first Load ms",
      "whole prefix ms", "MB/s", "remote/tier2 ratio (whole, per run)"))
for bt in sorted({r["block_tokens"] for r in rows if r.get("case") == "reuse"}, key=int):
    for src in ("remote", "tier2_cold", "tier2_warm"):
        rs = find("RESULT", case="reuse", block_tokens=bt, source=src)
        if not rs: continue
        def mm(key):
            xs = [float(r[key]) for r in rs]
            return "%.1f (%.1f-%.1f)" % (statistics.median(xs), min(xs), max(xs))
        ratio = ""
        if src != "remote":
            rt = []
            for run in runs:
                a = find("RESULT", run=run, case="reuse", block_tokens=bt, source="remote")
                t = find("RESULT", run=run, case="reuse", block_tokens=bt, source=src)
                if a and t: rt.append(float(a[0]["all_ms"]) / float(t[0]["all_ms"]))
            ratio = stats(rt)
        lb = rs[0]["load_blocks"]
        print("%-12s %-12s %18s %22s %22s %10s %s" % ("%s tok x%s/Load" % (bt, lb), src, mm("lookup_ms"),
              mm("first_ms"), mm("all_ms"), med([float(r["MBps"]) for r in rs]), ratio))
    bad = [r for r in find("RESULT", case="reuse", block_tokens=bt)
           if int(r["wrong"]) or int(r["other_tier"]) or r["lookup_found"] != r["blocks"]]
    if bad: print("    WARNING: %d runs with wrong bytes, other tiers or short lookups" % len(bad))
print()
print("3. Local Save latency, 1 MiB per Save, with write-behind busy vs without (goal: p99 within 10%)")
print("%-10s %-10s %-10s %-10s %-10s %-12s %s" % ("run", "p50 off", "p50 on", "p99 off", "p99 on",
      "p99 on/off", "write-behind MB/s during the run, dropped"))
p99r, p50r = [], []
for run in runs:
    off = find("RESULT", run=run, case="saves", remote=0)
    on = find("RESULT", run=run, case="saves", remote=1)
    if not (off and on): continue
    off, on = off[0], on[0]
    p99r.append(float(on["p99_ms"]) / float(off["p99_ms"]))
    p50r.append(float(on["p50_ms"]) / float(off["p50_ms"]))
    print("%-10s %-10s %-10s %-10s %-10s %-12.2f %s, %s" % (run, off["p50_ms"], on["p50_ms"], off["p99_ms"],
          on["p99_ms"], p99r[-1], on["remote_written_MBps"], on["dropped"]))
if p99r:
    print("p99 on/off: %s -> %s; p50 on/off: %s" % (stats(p99r),
          "met" if statistics.median(p99r) <= 1.10 else "NOT met", stats(p50r)))
EOF
cat "$OUT/summary.txt"
}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ "$SUMMARY_ONLY" = 1 ]; then summarize; exit; fi
BUILD=$(realpath "$1")
OUT=$2
RUNS=${3:-3}
BENCH=$BUILD/bench/evoke-remote-bench
EVOKED=$BUILD/daemon/evoked
BLOCKS=${BLOCKS:-"1MiB 4MiB"}
TOTAL=${TOTAL:-256MiB}
LOAD_BLOCKS=${LOAD_BLOCKS:-16}
VARIANT_INFLIGHT=${VARIANT_INFLIGHT-32}
RADOS_SECS=${RADOS_SECS:-10}
REUSE_BLOCK_TOKENS=${REUSE_BLOCK_TOKENS:-"16 256"}
SAVES=${SAVES:-2000}
CASES=${CASES:-"throughput reuse saves"}
LOAD_PATH=${LOAD_PATH:-shm}
PATHFLAG=()
[ "$LOAD_PATH" = shm ] && PATHFLAG=(--shm)
QUEUED=${QUEUED:-1}
export MEMSTORE_BYTES=${MEMSTORE_BYTES:-4294967296}
export LC_ALL=C

[ -x "$BENCH" ] || { echo "no $BENCH (cmake --build $BUILD --target evoke-remote-bench evoked)" >&2; exit 2; }
[ -x "$EVOKED" ] || { echo "no $EVOKED" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "root needed (the cold tier-2 case drops the page cache)" >&2; exit 2; }
command -v rados >/dev/null || { echo "no rados CLI (apt-get install ceph-common)" >&2; exit 2; }
mkdir -p "$OUT"
RAW=$OUT/raw.txt
: > "$RAW"
TMP=$(mktemp -d /tmp/bench-issue14.XXXXXX)
CDIR=$TMP/ceph
SCRATCH=$TMP/hosts
stop_cluster() {
  "$ROOT/scripts/ceph-dev-cluster.sh" stop "$CDIR" >/dev/null 2>&1
  rm -rf "$TMP"
}
trap stop_cluster EXIT
trap 'exit 130' INT TERM

log() { echo "$*" | tee -a "$RAW"; }
# run ROUND CMD...: prints the command line, runs it, keeps both streams in
# raw.txt, its RESULT lines tagged with the round.
run() {
  local round=$1
  shift
  log "+ $*"
  "$@" 2>&1 | sed "s/^RESULT /RESULT run=$round /" | tee -a "$RAW"
  return "${PIPESTATUS[0]}"
}
bytes_of() { numfmt --from=iec-i "${1%B}"; }

log "# bench-issue14 $(date -u +%FT%TZ) host=$(hostname) nproc=$(nproc) mem=$(free -g | awk '/Mem:/ {print $2}')GiB"
log "# git $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) bench=$BENCH"
log "# $(ceph --version 2>/dev/null)"
log "# CASES=$CASES LOAD_PATH=$LOAD_PATH QUEUED=$QUEUED BLOCKS=$BLOCKS TOTAL=$TOTAL LOAD_BLOCKS=$LOAD_BLOCKS VARIANT_INFLIGHT=$VARIANT_INFLIGHT RADOS_SECS=$RADOS_SECS REUSE_BLOCK_TOKENS=$REUSE_BLOCK_TOKENS SAVES=$SAVES RUNS=$RUNS MEMSTORE_BYTES=$MEMSTORE_BYTES"
log "+ scripts/ceph-dev-cluster.sh start $CDIR"
CONF=$(CEPH_DEV_OWNER_PID=$$ "$ROOT/scripts/ceph-dev-cluster.sh" start "$CDIR" 2>>"$RAW" | tail -1)
if [ ! -f "$CONF" ]; then
  log "cluster did not start (see raw.txt)"
  exit 1
fi
log "# cluster: $(ceph -c "$CONF" -s 2>/dev/null | grep -E 'osd:|pools:' | tr -s ' ' | tr '\n' ';')"
R=(rados -c "$CONF" -p evoke)

# rados_case ROUND CASE BLOCK_BYTES ARGS...: runs `rados bench ARGS`, keeps
# its output, and logs a RADOS line whose MB/s (1e6 bytes) is counted the
# way evoke-remote-bench counts: ops x op size / total time. (rados bench's
# own "Bandwidth (MB/sec)" is in MiB/s; it is kept as MiBps_rados.)
rados_case() {
  local round=$1 tag=$2 block=$3
  shift 3
  log "+ ${R[*]} bench $*"
  local out
  out=$("${R[@]}" bench "$@" 2>&1)
  echo "$out" >> "$RAW"
  echo "$out" | awk -v tag="$tag" -v r="$round" -v b="$block" '
    /^Total time run:/ { t = $NF }
    /^Total (writes|reads) made:/ { n = $NF }
    /^(Write|Read) size:/ { sz = $NF }
    /^Bandwidth \(MB\/sec\):/ { bw = $NF }
    END { if (t > 0) printf "RADOS run=%s case=%s block_bytes=%s ops=%d s=%.3f MBps=%.1f MiBps_rados=%s\n",
            r, tag, b, n, t, n * sz / t / 1e6, bw
          else printf "RADOS run=%s case=%s block_bytes=%s failed=1\n", r, tag, b }' | tee -a "$RAW"
}
# purge_ns NS: removes the namespace's objects.
purge_ns() {
  "${R[@]}" -N "$1" ls 2>/dev/null | xargs -r "${R[@]}" -N "$1" rm 2>>"$RAW"
}
NSN=0
# evoke ROUND ARGS...: evoke-remote-bench ARGS in a fresh namespace.
evoke() {
  local round=$1 sub=$2
  shift 2
  NSN=$((NSN + 1))
  local ns="b14-$$-$NSN"
  run "$round" "$BENCH" "$sub" --dir "$SCRATCH" --conf "$CONF" --ns "$ns" --evoked "$EVOKED" "$@"
  purge_ns "$ns"
}

has() { case " $CASES " in *" $1 "*) return 0;; esac; return 1; }
OSDS=()
if [ "$QUEUED" = 1 ]; then
  OSDS=(--osd-pids)
  for f in "$CDIR"/pids/osd.*.pid; do OSDS+=("$(cat "$f")"); done
fi
for r in $(seq 1 "$RUNS"); do
  has throughput && for b in $BLOCKS; do
    bb=$(bytes_of "$b")
    log "## run $r block $b: $(uptime)"
    baseline() {
      rados_case "$r" write "$bb" "$RADOS_SECS" write -t 16 -b "$bb" --no-cleanup --run-name "r$r-$b"
      rados_case "$r" seq "$bb" "$RADOS_SECS" seq -t 16 --run-name "r$r-$b"
      "${R[@]}" cleanup --run-name "r$r-$b" >> "$RAW" 2>&1
    }
    ours() {
      evoke "$r" throughput --block-bytes "$b" --total-bytes "$TOTAL" --load-blocks "$LOAD_BLOCKS" --inflight 16 "${OSDS[@]}" "${PATHFLAG[@]}"
      if [ -n "$VARIANT_INFLIGHT" ]; then
        evoke "$r" throughput --block-bytes "$b" --total-bytes "$TOTAL" --load-blocks "$LOAD_BLOCKS" --inflight "$VARIANT_INFLIGHT" "${OSDS[@]}" "${PATHFLAG[@]}"
      fi
    }
    if [ $((r % 2)) = 1 ]; then baseline; ours; else ours; baseline; fi
  done
  has reuse && for bt in $REUSE_BLOCK_TOKENS; do
    log "## run $r reuse block_tokens $bt: $(uptime)"
    lb=$(( LOAD_BLOCKS * 16 / bt )); [ "$lb" -ge 1 ] || lb=1   # 256 tokens per Load
    remote() { evoke "$r" reuse --source remote --block-tokens "$bt" --load-blocks "$lb" --drop-caches "${PATHFLAG[@]}"; }
    tier2() {
      evoke "$r" reuse --source tier2 --block-tokens "$bt" --load-blocks "$lb" --drop-caches "${PATHFLAG[@]}"
      evoke "$r" reuse --source tier2 --block-tokens "$bt" --load-blocks "$lb" "${PATHFLAG[@]}"
    }
    if [ $((r % 2)) = 1 ]; then remote; tier2; else tier2; remote; fi
  done
  has saves || continue
  log "## run $r saves: $(uptime)"
  if [ $((r % 2)) = 1 ]; then
    evoke "$r" saves --saves "$SAVES"
    evoke "$r" saves --saves "$SAVES" --remote
  else
    evoke "$r" saves --saves "$SAVES" --remote
    evoke "$r" saves --saves "$SAVES"
  fi
done
log "## done: $(uptime)"
log "# pool after the run: $("${R[@]}" df 2>/dev/null | awk 'NR==2 {print $0}')"

summarize
