#!/usr/bin/env bash
# Runs clang-tidy (Debian's, with the checks of .clang-tidy) over every C++ source outside tests/,
# using the compile commands of a configured build folder (default build/). Any warning fails it.
# Usage: scripts/tidy.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "tidy: $build/compile_commands.json is missing: configure the build first (scripts/build.sh)" >&2
  exit 2
fi
log="$build/clang-tidy.log"
started=$SECONDS
# Sources of the compile database outside tests/ (the unit tests' gtest macros are not ours to tidy).
if run-clang-tidy -p "$build" -j 2 -quiet '^(?!.*/tests/).*\.cpp$' -extra-arg=-Wno-unknown-warning-option >"$log" 2>&1; then
  echo "tidy: clang-tidy found nothing ($((SECONDS - started)) s)"
else
  grep -E "(warning|error): " "$log" | sed 's/\x1b\[[0-9;]*m//g' | sort -u >&2 || true
  echo "tidy: clang-tidy failed; full output in $log" >&2
  exit 1
fi
