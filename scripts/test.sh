#!/usr/bin/env bash
# Installs what the tests need, builds, runs every test and prints ctest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --test
# Warnings are errors in the tested build; clang-tidy runs below.
scripts/build.sh Release -DPOPART_WERROR=ON
# The unit tests also run under AddressSanitizer and UndefinedBehaviorSanitizer, in the clang build
# that also makes the libFuzzer targets (scripts/sanitize-build.sh): the library is compiled once.
echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (clang, build-san) =="
scripts/sanitize-build.sh unit_tests fuzz_targets
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 build-san/tests/unit_tests --gtest_brief=1
# Concurrent sessions under ThreadSanitizer, two OpenMP threads per session (docs/threads.md).
echo "== concurrent sessions under POPART_SANITIZE=thread (scripts/tsan.sh) =="
scripts/tsan.sh
# The libFuzzer targets (docs/fuzzing.md): their regression inputs, then 30 s of fuzzing each from
# a fixed seed, so that a finding here can be repeated (a new finding fails the run, as it should).
echo "== fuzzing (scripts/fuzz.sh 30) =="
fuzz=0
POPART_FUZZ_SEED=1 POPART_FUZZ_TIMEOUT=30 scripts/fuzz.sh 30 || fuzz=$?
cd build
set +e
ctest --output-on-failure -j2 --timeout 1800 >ctest.log 2>&1
status=$?
set -e
grep -h "ONNX backend:\|^cli:" Testing/Temporary/LastTest.log 2>/dev/null || true
grep -vE "^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed" ctest.log
cd ..
echo "== clang-tidy =="
tidy=0
scripts/tidy.sh build || tidy=$?
if ((status == 0)); then status=$tidy; fi
if ((status == 0)); then status=$fuzz; fi
exit "$status"
