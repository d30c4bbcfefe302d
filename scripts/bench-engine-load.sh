#!/usr/bin/env bash
# bench-engine-load.sh: the engine's cold Load from tier 2 (evoke-tier2-bench
# engine-load), one disk read at a time and several in flight, against
# `dd iflag=direct` of the same bytes on the same filesystem, alternating.
#
#   scripts/bench-engine-load.sh BENCH [ROUNDS] [DIR]
#
# Per round and block size (64 KiB, 4 MiB): a dd of a 512 MiB file with
# iflag=direct (queue depth 1, the baseline), then engine-load of 512 MiB
# (one round: reads_in_flight=1, then 4), 16 blocks per Load for 64 KiB and
# 4 per Load for 4 MiB. Prints one line per round. DIR (default
# /var/tmp/evoke-engine-load) must be on the disk under test, not tmpfs.
set -uo pipefail
[ $# -ge 1 ] || { sed -n 2,12p "$0" >&2; exit 2; }
B=$1 ROUNDS=${2:-3} D=${3:-/var/tmp/evoke-engine-load}
mkdir -p "$D"
[ "$(stat -f -c %T "$D")" != tmpfs ] || { echo "$D is on tmpfs" >&2; exit 2; }
dd if=/dev/urandom of="$D/dd.bin" bs=1M count=512 conv=fdatasync status=none
for r in $(seq "$ROUNDS"); do
  for bs in 64KiB 4MiB; do
    if [ "$bs" = 64KiB ]; then ddbs=64K batch=16; else ddbs=4M batch=4; fi
    ddd=$(dd if="$D/dd.bin" of=/dev/null bs=$ddbs iflag=direct 2>&1 | grep -oE "[0-9.]+ [MG]B/s")
    res=$("$B" engine-load --dir "$D/s" --block-bytes $bs --total-bytes 512MiB --batch $batch \
            --rounds 1 2>&1 | grep RESULT | grep -oE "reads_in_flight=[0-9]+|read_MBps=[0-9.]+" |
          tr '\n' ' ')
    echo "round=$r bs=$bs dd_direct='$ddd' $res"
  done
done
rm -rf "$D"
