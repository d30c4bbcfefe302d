#!/usr/bin/env bash
# build_llama_cpp.sh ROOT [C_COMPILER CXX_COMPILER]
#
# Fetches llama.cpp at the pinned release and builds its `llama` library for
# the CPU (static; tests, examples, tools and server off), installing it into
# ROOT/install. CMake runs this at configure time (engines/llama/CMakeLists.txt);
# ROOT is inside the build tree, so the build is cached there and repeated
# configures cost nothing. No llama.cpp code is ever committed to evoke.
#
# Source: the npm package node-llama-cpp@3.22.1 ships llama.cpp's release
# source as a git bundle (llama/gitRelease.bundle). The package comes from the
# npm registry with `npm pack` when npm is installed, or else the same tarball
# from the same registry with curl; either way its SHA-512 is checked.
set -euo pipefail

ROOT=${1:?usage: build_llama_cpp.sh ROOT [C_COMPILER CXX_COMPILER]}
CC_BIN=${2:-cc}
CXX_BIN=${3:-c++}

NPM_PACKAGE=node-llama-cpp
NPM_VERSION=3.22.1
TARBALL=${NPM_PACKAGE}-${NPM_VERSION}.tgz
TARBALL_SHA512=6e5b488a9b9699cd76dc7eed30880318a4ac4ab866865418795502e3c5d38d55bb5c624988927209d95333343f2e25a83e4183a5c2f816f883a60c3ba9f4e20f
LLAMA_COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6  # the bundle's release ("v0.5.0" of node-llama-cpp's build)

CMAKE_FLAGS=(
  -G Ninja
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN"
  -DBUILD_SHARED_LIBS=OFF
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=ON
)
STAMP_TEXT="${NPM_PACKAGE}@${NPM_VERSION} ${LLAMA_COMMIT} ${CMAKE_FLAGS[*]}"
STAMP=$ROOT/install/.evoke-stamp

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ]; then
  exit 0
fi

mkdir -p "$ROOT/download"
cd "$ROOT/download"
if ! echo "$TARBALL_SHA512  $TARBALL" | sha512sum --check --status 2>/dev/null; then
  rm -f "$TARBALL"
  if command -v npm >/dev/null 2>&1; then
    echo "llama.cpp: npm pack ${NPM_PACKAGE}@${NPM_VERSION}" >&2
    npm pack --silent "${NPM_PACKAGE}@${NPM_VERSION}" >/dev/null
  else
    echo "llama.cpp: fetching ${TARBALL} from registry.npmjs.org (npm not installed)" >&2
    URL="https://registry.npmjs.org/${NPM_PACKAGE}/-/${TARBALL}"
    if ! curl -fsSL --retry 3 -o "$TARBALL" "$URL"; then
      # Behind a TLS-intercepting egress proxy whose CA this machine lacks,
      # fetch without certificate checks: the pinned SHA-512 below is what
      # authenticates the bytes either way.
      echo "llama.cpp: retrying without TLS certificate checks (the SHA-512 pin still applies)" >&2
      curl -fsSL --retry 3 --insecure -o "$TARBALL" "$URL"
    fi
  fi
  if ! echo "$TARBALL_SHA512  $TARBALL" | sha512sum --check --status; then
    echo "llama.cpp: ${TARBALL} does not have the pinned SHA-512" >&2
    exit 1
  fi
fi

rm -rf "$ROOT/bundle" "$ROOT/src" "$ROOT/build" "$ROOT/install"
mkdir -p "$ROOT/bundle"
tar -xzf "$TARBALL" -C "$ROOT/bundle" package/llama/gitRelease.bundle
git -c advice.detachedHead=false clone --quiet "$ROOT/bundle/package/llama/gitRelease.bundle" "$ROOT/src"
git -C "$ROOT/src" -c advice.detachedHead=false checkout --quiet "$LLAMA_COMMIT"
rm -rf "$ROOT/bundle"

echo "llama.cpp: building the llama library (CPU) at ${LLAMA_COMMIT:0:7}" >&2
cmake -S "$ROOT/src" -B "$ROOT/build" "${CMAKE_FLAGS[@]}" \
  -DCMAKE_INSTALL_PREFIX="$ROOT/install" >"$ROOT/configure.log" 2>&1 ||
  { tail -30 "$ROOT/configure.log" >&2; exit 1; }
cmake --build "$ROOT/build" -j "$(nproc)" >"$ROOT/build.log" 2>&1 ||
  { tail -30 "$ROOT/build.log" >&2; exit 1; }
cmake --install "$ROOT/build" >"$ROOT/install.log" 2>&1 ||
  { tail -30 "$ROOT/install.log" >&2; exit 1; }
echo "$STAMP_TEXT" >"$STAMP"
