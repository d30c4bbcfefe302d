#!/usr/bin/env bash
# test.sh: installs what is missing, builds, and runs the whole test suite.
# This is the command CI runs (.ci/run). Unit tests and end-to-end tests (real
# evoked processes on Unix sockets in temp dirs, real RocksDB) all run; then
# the libFuzzer targets (scripts/fuzz.sh: clang-14, ASan+UBSan, build-fuzz)
# replay their seeds and regression inputs and fuzz EVOKE_FUZZ_SECONDS
# (default 20) each. EVOKE_FUZZ_SECONDS=0 skips them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
scripts/build.sh
(cd "${EVOKE_BUILD_DIR:-build}" && ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@")
if [ "${EVOKE_FUZZ_SECONDS:-20}" != 0 ]; then
  scripts/fuzz.sh "${EVOKE_FUZZ_SECONDS:-20}"
fi
