#!/usr/bin/env bash
# Builds TARGETs in build-san: clang with AddressSanitizer + UndefinedBehaviorSanitizer and
# libFuzzer's coverage (-DPOPART_FUZZ=ON), -O1 with line tables. One build serves both the unit
# tests under the sanitizers (scripts/test.sh) and the fuzz targets (scripts/fuzz.sh), so that the
# library is compiled once for both. Usage: scripts/sanitize-build.sh TARGET...
set -euo pipefail
cd "$(dirname "$0")/.."
dir=build-san
# A build folder configured with another compiler cannot be switched to clang in place.
if [[ -f $dir/CMakeCache.txt ]] && ! grep -q "^CMAKE_CXX_COMPILER:.*clang++" "$dir/CMakeCache.txt"; then
  rm -rf "$dir"
fi
CC=clang CXX=clang++ CCACHE_BASEDIR="$PWD" cmake -S . -B "$dir" -DPOPART_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" >/dev/null
cmake --build "$dir" -j2 --target "$@"
