#!/usr/bin/env bash
# setup-debian.sh: installs everything evoke needs to build, test and run on Debian 12.
#
# Idempotent: when every package is already installed it does nothing (no
# network access), so the README commands can be re-run cheaply. Runs apt-get
# directly as root, or through sudo otherwise.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  librocksdb-dev libabsl-dev libxxhash-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  redis-server libhiredis-dev procps curl
  libpagmo-dev nlohmann-json3-dev
  clang-14 libclang-rt-14-dev
  # The remote tier (issue #14): librados to build it, and a throwaway Ceph
  # cluster on loopback for its tests (scripts/ceph-dev-cluster.sh). ~52 s
  # more on a fresh Debian 12 with --no-install-recommends.
  ceph-mon ceph-osd ceph-mgr ceph-common librados-dev libradospp-dev
  # Operations surfaces (issue #15): /metrics through prometheus-cpp, checked
  # with promtool (package prometheus); the Python client on Debian's
  # interpreter, grpcio, protobuf and numpy; tmux to test `evokectl top`.
  prometheus-cpp-dev prometheus python3-grpcio python3-protobuf python3-numpy tmux
  # The shipped model (issue #24): trained with Debian's PyTorch on the CPU
  # (models/train.sh; CI trains a tiny one), fast with OpenBLAS.
  python3-torch libopenblas0-pthread
  # The Kubernetes manifests' checks (issue #25, tests/k8s): Node.js runs the
  # OpenAPI schema validation and the admission policy's CEL, with the npm
  # packages pinned in tests/k8s/package-lock.json.
  nodejs
  # evoke-serve (issue #29): its HTTP server.
  libcpp-httplib-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# npm: Debian's package, unless the Node.js installed has its own npm.
if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The npm packages of tests/k8s and tests/serve_js (the openai client that
# drives evoke-serve), exactly as locked (again only when a lock file changed
# since the last install).
for dir in k8s serve_js; do
  NPM_DIR="$(cd "$(dirname "$0")/.." && pwd)/tests/$dir"
  if [ ! -f "$NPM_DIR/node_modules/.package-lock.json" ] ||
     [ "$NPM_DIR/package-lock.json" -nt "$NPM_DIR/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in tests/$dir" >&2
    npm ci --prefix "$NPM_DIR" --no-audit --no-fund --loglevel=error >/dev/null
  fi
done
