#!/usr/bin/env bash
# Installs what the tests need, builds, runs every test and prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
scripts/build.sh Release
cd build
set +e
ctest --output-on-failure -j2 --timeout 1800 >ctest.log 2>&1
status=$?
set -e
grep -h "ONNX backend:\|^cli:" Testing/Temporary/LastTest.log 2>/dev/null || true
grep -vE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed" ctest.log
exit "$status"
