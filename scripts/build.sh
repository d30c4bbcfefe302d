#!/usr/bin/env bash
# build.sh: configures and builds evoke into ./build (or $EVOKE_BUILD_DIR).
# CUDA code is compiled when nvcc is found; set EVOKE_CUDA=OFF to skip it.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${EVOKE_BUILD_DIR:-build}
args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=${EVOKE_BUILD_TYPE:-RelWithDebInfo} -DEVOKE_WERROR=ON)
if [ -n "${EVOKE_CUDA:-}" ]; then args+=(-DEVOKE_CUDA="$EVOKE_CUDA"); fi
# ccache, where installed, makes rebuilds in fresh build trees cheap.
if command -v ccache >/dev/null; then args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache); fi
cmake "${args[@]}" >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
