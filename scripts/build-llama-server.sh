#!/usr/bin/env bash
# build-llama-server.sh: builds llama.cpp's own llama-server from the same
# pinned source evoke builds against (fetched by the main build into
# build/_deps/llama.cpp/src), for comparisons (scripts/bench-serve.sh), into
# build-llama-server/bin/llama-server. About 10 minutes on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC="$ROOT/${EVOKE_BUILD_DIR:-build}/_deps/llama.cpp/src"
OUT="$ROOT/build-llama-server"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  echo "build-llama-server: no llama.cpp source at $SRC (run scripts/build.sh first)" >&2
  exit 1
fi
# The flags of engines/llama/build_llama_cpp.sh, with the server and its
# common library on.
cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DGGML_OPENMP=ON >/dev/null
cmake --build "$OUT" --target llama-server -j "$(nproc)"
echo "$OUT/bin/llama-server"
