#!/usr/bin/env bash
# serve.sh: installs what is missing, builds, and runs evoke-serve on the
# trained model (models/evoke-recall.gguf) at http://127.0.0.1:8080, with its
# own evoked keeping conversations in ./evoke-serve-data. Flags go to
# evoke-serve (build/serve/evoke-serve --help lists them), e.g.
#   scripts/serve.sh --port 9000 --kv-budget 16384
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
scripts/setup-debian.sh
scripts/build.sh >/dev/null
exec "$ROOT/${EVOKE_BUILD_DIR:-build}/serve/evoke-serve" "$@"
