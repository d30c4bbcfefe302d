#!/usr/bin/env bash
# bench-issue13.sh: issue #13's tier-2 goals, each beside its dd baseline on
# the same filesystem in the same minute, and the summary (median, min and
# max of each ratio over the runs).
#
#   scripts/bench-issue13.sh BUILD OUT_DIR [RUNS]
#
# BUILD: a build dir with evoke-tier2-bench and evoked built (ninja -C BUILD
# evoke-tier2-bench). OUT_DIR: where the raw output goes (e.g.
# bench/results/issue13-before); RUNS: rounds, default 3. Root is needed
# (the cold cases drop the page cache). Environment:
#   DATA=DIR          scratch dir on the disk under test (default
#                     BUILD/bench-issue13-data; refused on tmpfs)
#   TOTAL=1GiB        payload bytes per spill/load case
#   BLOCKS="4MiB 64KiB"  block sizes
#   BATCH=16MiB       payload bytes per Put (the spill cases)
#   SIGTERM_BLOCKS=1000000 SIGTERM_PAYLOAD=256 SIGTERM_RUNS=3
#                     the SIGTERM flush case (SIGTERM_RUNS=0 skips it)
# Each round, per block size, one after the other:
#   dd write    dd if=/dev/zero of=DATA/dd.bin bs=B count=N conv=fdatasync
#   spill sync  evoke-tier2-bench spill --sync (each 16 MiB Put with sync=true)
#   dd write    again (the baseline of the next case)
#   spill nosync evoke-tier2-bench spill (sync=false, Persist at the end)
#   dd cold     drop caches; dd if=DATA/dd.bin of=/dev/null bs=B iflag=direct
#   load        evoke-tier2-bench load --drop-caches (cold pass, then warm)
#   dd warm     dd if=DATA/dd.bin of=/dev/null bs=B, twice; the second counts
# then the SIGTERM case (evoke-tier2-bench sigterm), which has no baseline:
# its goal is absolute (< 5 s). Raw output: OUT_DIR/raw.txt (every command
# line, dd's own output, the bench's RESULT lines, uptime before each step);
# the summary: OUT_DIR/summary.txt.
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,32p "$0" >&2
  exit 2
fi
BUILD=$(realpath "$1")
OUT=$2
RUNS=${3:-3}
BENCH=$BUILD/bench/evoke-tier2-bench
DATA=${DATA:-$BUILD/bench-issue13-data}
TOTAL=${TOTAL:-1GiB}
BLOCKS=${BLOCKS:-"4MiB 64KiB"}
BATCH=${BATCH:-16MiB}
SIGTERM_BLOCKS=${SIGTERM_BLOCKS:-1000000}
SIGTERM_PAYLOAD=${SIGTERM_PAYLOAD:-256}
SIGTERM_RUNS=${SIGTERM_RUNS:-3}
export LC_ALL=C

[ -x "$BENCH" ] || { echo "no $BENCH (ninja -C $BUILD evoke-tier2-bench)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "root needed (drop_caches)" >&2; exit 2; }
mkdir -p "$OUT" "$DATA"
FSTYPE=$(stat -f -c %T "$DATA")
if [ "$FSTYPE" = tmpfs ]; then
  echo "$DATA is on tmpfs: the cases measure a disk (set DATA=)" >&2
  exit 2
fi
RAW=$OUT/raw.txt
: > "$RAW"

log() { echo "$*" | tee -a "$RAW"; }
# run prints the command line, runs it, keeps both streams in raw.txt.
# run ROUND CMD...: prints the command line, runs it, keeps both streams in
# raw.txt, its RESULT lines tagged with the round.
run() {
  local round=$1
  shift
  log "+ $*"
  "$@" 2>&1 | sed "s/^RESULT /RESULT run=$round /" | tee -a "$RAW"
  return "${PIPESTATUS[0]}"
}
# dd_case TAG RUN BLOCK DD_ARGS...: runs dd and logs a DD line with its MB/s
# (bytes / seconds from dd's last line, "N bytes (...) copied, S s, ...").
dd_case() {
  local tag=$1 round=$2 block=$3
  shift 3
  log "+ dd $*"
  local line
  line=$(dd "$@" 2>&1 | tail -1)
  echo "$line" >> "$RAW"
  echo "$line" | awk -F', ' -v tag="$tag" -v r="$round" -v b="$block" '
    { split($3, s, " "); printf "DD run=%s case=%s block_bytes=%s bytes=%d s=%.4f MBps=%.1f\n",
        r, tag, b, $1 + 0, s[1], ($1 + 0) / s[1] / 1e6 }' | tee -a "$RAW"
}
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# clean removes files and lets the filesystem settle: / is mounted with
# `discard` here, and the discards of a just-deleted GiB slowed the next
# write case 3x in a trial.
clean() { rm -rf "$@"; sync; sleep 2; }
bytes_of() { numfmt --from=iec-i "${1%B}"; }

log "# bench-issue13 $(date -u +%FT%TZ) host=$(hostname) nproc=$(nproc)"
log "# git $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null) bench=$BENCH"
log "# DATA=$DATA fs=$FSTYPE $(df -h "$DATA" | tail -1)"
log "# TOTAL=$TOTAL BLOCKS=$BLOCKS BATCH=$BATCH RUNS=$RUNS SIGTERM_BLOCKS=$SIGTERM_BLOCKS SIGTERM_PAYLOAD=$SIGTERM_PAYLOAD SIGTERM_RUNS=$SIGTERM_RUNS"

total_bytes=$(bytes_of "$TOTAL")
for r in $(seq 1 "$RUNS"); do
  for b in $BLOCKS; do
    bb=$(bytes_of "$b")
    count=$(( total_bytes / bb ))
    sz=(--block-bytes "$b" --total-bytes "$TOTAL")
    log "## run $r block $b: $(uptime)"
    clean "$DATA/dd.bin" "$DATA/store"
    dd_case write "$r" "$bb" if=/dev/zero of="$DATA/dd.bin" bs="$bb" count="$count" conv=fdatasync
    run "$r" "$BENCH" spill --dir "$DATA/store" "${sz[@]}" --batch-bytes "$BATCH" --sync
    clean "$DATA/dd.bin"
    log "## $(uptime)"
    dd_case write2 "$r" "$bb" if=/dev/zero of="$DATA/dd.bin" bs="$bb" count="$count" conv=fdatasync
    run "$r" "$BENCH" spill --dir "$DATA/store" "${sz[@]}" --batch-bytes "$BATCH" --keep
    log "## $(uptime)"
    drop_caches
    dd_case cold "$r" "$bb" if="$DATA/dd.bin" of=/dev/null bs="$bb" iflag=direct
    run "$r" "$BENCH" load --dir "$DATA/store" "${sz[@]}" --drop-caches
    dd if="$DATA/dd.bin" of=/dev/null bs="$bb" 2>/dev/null
    dd_case warm "$r" "$bb" if="$DATA/dd.bin" of=/dev/null bs="$bb"
    clean "$DATA/dd.bin" "$DATA/store"
  done
done
for r in $(seq 1 "$SIGTERM_RUNS"); do
  log "## sigterm run $r: $(uptime)"
  run "$r" "$BENCH" sigterm --dir "$DATA/sigterm" --blocks "$SIGTERM_BLOCKS" \
    --payload-bytes "$SIGTERM_PAYLOAD" --evoked "$BUILD/daemon/evoked"
  clean "$DATA/sigterm"
done
log "## done: $(uptime)"

python3 - "$RAW" > "$OUT/summary.txt" <<'EOF'
import re, statistics, sys
rows = []
for line in open(sys.argv[1]):
    if line.startswith(("RESULT ", "DD ")):
        kv = dict(re.findall(r"(\w+)=(\S+)", line))
        kv["kind"] = line.split()[0]
        rows.append(kv)
def find(kind, **want):
    return [r for r in rows if r["kind"] == kind and all(r.get(k) == str(v) for k, v in want.items())]
def stats(xs):
    if not xs: return "n/a"
    return "%.2f (min %.2f, max %.2f, n=%d)" % (statistics.median(xs), min(xs), max(xs), len(xs))
def fig(xs):
    return "%.0f" % statistics.median(xs) if xs else "n/a"
runs = sorted({r["run"] for r in rows if "run" in r and r.get("case") != "sigterm"})
blocks = []
for r in rows:
    if r["kind"] == "DD" and r["block_bytes"] not in blocks: blocks.append(r["block_bytes"])
# Ratio: each run's figure over the dd run just before it (same minute);
# the last column divides the median figure by the median dd, which is
# steadier when dd itself swings (this VM's disk does, 3x at times).
print("%-34s %12s %12s   %-36s %s" % ("case", "evoke MB/s", "dd MB/s",
      "ratio per run: median (min, max, n)", "median/median"))
for b in blocks:
    name = "%d KiB" % (int(b) >> 10) if int(b) < (1 << 20) else "%d MiB" % (int(b) >> 20)
    cases = [("spill sync=true " + name, "spill", "sync", "put_MBps", "write"),
             ("spill sync=false+Persist " + name, "spill", "nosync_persist", "put_persist_MBps", "write2"),
             ("cold load " + name, "load", "cold", "read_MBps", "cold"),
             ("warm load " + name, "load", "warm", "read_MBps", "warm")]
    for label, case, mode, key, ddcase in cases:
        ev, dd, ratio = [], [], []
        for run in runs:
            e = find("RESULT", run=run, case=case, mode=mode, block_bytes=b)
            d = find("DD", run=run, case=ddcase, block_bytes=b)
            if e and d:
                ev.append(float(e[0][key])); dd.append(float(d[0]["MBps"]))
                ratio.append(ev[-1] / dd[-1])
        mm = "%.2f" % (statistics.median(ev) / statistics.median(dd)) if ev else "n/a"
        print("%-34s %12s %12s   %-36s %s" % (label, fig(ev), fig(dd), stats(ratio), mm))
print()
print("bytes written to the device per payload byte (/proc/self/io write_bytes, median over runs)")
for b in blocks:
    for mode in ("sync", "nosync_persist"):
        rs = [r for r in rows if r["kind"] == "RESULT" and r.get("case") == "spill"
              and r["mode"] == mode and r["block_bytes"] == b]
        if not rs: continue
        line = "  %-8s block %8s:" % (mode, b)
        for tag in ("put", "persist", "settled", "closed"):
            line += " %s %s" % (tag, stats([float(r[tag + "_wb_per_byte"]) for r in rs]).split(" (")[0])
        line += "  dir_bytes/payload %.2f" % statistics.median(
            [int(r["dir_bytes"]) / int(r["payload_bytes"]) for r in rs])
        print(line)
loads = [r for r in rows if r["kind"] == "RESULT" and r.get("case") == "load" and r["mode"] == "cold"]
if loads:
    print("cold open (s, median): %s; device bytes read at open / payload: %s" % (
        stats([float(r["open_s"]) for r in loads]),
        stats([int(r["open_device_read_bytes"]) / (int(r["block_bytes"]) * int(r["blocks"])) for r in loads])))
terms = [r for r in rows if r["kind"] == "RESULT" and r.get("case") == "sigterm"]
if terms:
    print()
    print("SIGTERM flush: %s blocks of %s B: SIGTERM to exit %s s; restart to serving %s s; "
          "sample loaded from disk %s, wrong %s; daemon bytes written per payload byte %s; "
          "daemon CPU s %s" % (
              terms[0]["blocks"], terms[0]["payload_bytes"],
              stats([float(r["sigterm_to_exit_s"]) for r in terms]),
              stats([float(r["restart_to_serving_s"]) for r in terms]),
              "/".join([r["sample_from_disk"] + "of" + r["sample"] for r in terms]),
              sum(int(r["sample_wrong"]) for r in terms),
              stats([float(r["daemon_wb_per_payload_byte"]) for r in terms]),
              stats([float(r["daemon_cpu_s"]) for r in terms])))
EOF
cat "$OUT/summary.txt"
