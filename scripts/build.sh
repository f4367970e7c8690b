#!/usr/bin/env bash
# Configures and builds into build/ (Release by default). Usage: scripts/build.sh [BUILD_TYPE] [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
type="${1:-Release}"
shift || true
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -DCMAKE_BUILD_TYPE="$type" "$@" >/dev/null
cmake --build build -j2
