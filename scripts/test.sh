#!/usr/bin/env bash
# test.sh: installs what is missing, builds, and runs the whole test suite.
# This is the command CI runs (.ci/run). Unit tests and end-to-end tests (real
# evoked processes on Unix sockets in temp dirs, real RocksDB) all run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-debian.sh
scripts/build.sh
cd "${EVOKE_BUILD_DIR:-build}"
ctest --output-on-failure -j "$(nproc)" --timeout 600 "$@"
