#!/usr/bin/env bash
# make_device_carry.sh: bundles what gpu/device_check.sh needs on a GPU
# machine that has CUDA but no gRPC, RocksDB or Abseil packages: the built
# binaries (stripped) and every shared library they load except glibc's.
# Output: .device-carry/{bin,lib} (git-ignored), to carry with the run.
set -euo pipefail
cd "$(dirname "$0")/.."
# EVOKE_BUILD_DIR: a build configured with -DEVOKE_CUDA=ON (see device_check.sh).
BUILD=${EVOKE_BUILD_DIR:-build}
OUT=.device-carry
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
BINS=(daemon/evoked tools/evokectl/evokectl bench/evoke-bench gpu/gpu_test gpu/cuda_ipc_test
      gpu/ipc_exporter tests/cuda_e2e_test gpu/gpu_pipeline_bench)
for b in "${BINS[@]}"; do
  [ -x "$BUILD/$b" ] || { echo "missing $BUILD/$b (build with CUDA first)" >&2; exit 1; }
  cp "$BUILD/$b" "$OUT/bin/"
  strip --strip-debug "$OUT/bin/$(basename "$b")"
done
for b in "$OUT"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
strip --strip-debug "$OUT"/lib/* 2>/dev/null || true
du -sh "$OUT"
