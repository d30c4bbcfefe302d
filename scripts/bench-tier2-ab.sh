#!/usr/bin/env bash
# bench-tier2-ab.sh: two evoke-tier2-bench binaries (before and after a
# change) spilling the same bytes, alternating, each pair after a dd of the
# same bytes on the same filesystem.
#
#   scripts/bench-tier2-ab.sh OLD_BENCH NEW_BENCH [ROUNDS] [DIR]
#
# Per round, block size (64 KiB, 4 MiB) and mode (each Put durable; not
# durable, Persist at the end): two dd baselines (through the page cache with
# conv=fdatasync, and oflag=direct with conv=fdatasync), then OLD, then NEW,
# 1 GiB each, 16 MiB per Put. Prints one line per run (the dd rates, the
# bench's put_MBps, put_persist_MBps and closed_wb_per_byte). DIR (default
# /var/tmp/evoke-tier2-ab) must be on the disk under test, not tmpfs.
set -uo pipefail
[ $# -ge 2 ] || { sed -n 2,14p "$0" >&2; exit 2; }
OLD=$1 NEW=$2 ROUNDS=${3:-3} D=${4:-/var/tmp/evoke-tier2-ab}
mkdir -p "$D"
[ "$(stat -f -c %T "$D")" != tmpfs ] || { echo "$D is on tmpfs" >&2; exit 2; }
for r in $(seq "$ROUNDS"); do
  for bs in 64KiB 4MiB; do
    if [ "$bs" = 64KiB ]; then ddbs=64K cnt=16384; else ddbs=4M cnt=256; fi
    for mode in sync nosync; do
      rm -f "$D/dd.bin"; sync
      dds=$(dd if=/dev/zero of="$D/dd.bin" bs=$ddbs count=$cnt conv=fdatasync 2>&1 |
            grep -oE "[0-9.]+ [MG]B/s")
      rm -f "$D/dd.bin"; sync
      ddd=$(dd if=/dev/zero of="$D/dd.bin" bs=$ddbs count=$cnt oflag=direct conv=fdatasync 2>&1 |
            grep -oE "[0-9.]+ [MG]B/s")
      for side in old new; do
        if [ "$side" = old ]; then B=$OLD; else B=$NEW; fi
        extra=(); [ "$mode" = sync ] && extra=(--sync)
        res=$("$B" spill --dir "$D/s" --block-bytes $bs --total-bytes 1GiB "${extra[@]}" 2>&1 |
              grep RESULT |
              grep -oE "put_MBps=[0-9.]+|put_persist_MBps=[0-9.]+|closed_wb_per_byte=[0-9.]+" |
              tr '\n' ' ')
        echo "round=$r bs=$bs mode=$mode dd='$dds' dd_direct='$ddd' side=$side $res"
        rm -rf "$D/s"
      done
    done
  done
done
rm -rf "$D"
