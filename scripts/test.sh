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
# Concurrent sessions under ThreadSanitizer: only the test's own target is built (docs/threads.md).
# Two OpenMP threads per session, on LLVM's OpenMP runtime with its Archer tool, which tells TSan
# about the runtime's own synchronisation (Debian's libgomp is not built for TSan, whose thread
# pool hand-offs it reports as races); libomp implements libgomp's ABI and takes its place.
echo "== concurrent sessions under POPART_SANITIZE=thread =="
CCACHE_BASEDIR="$PWD" cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DPOPART_SANITIZE=thread >/dev/null
cmake --build build-tsan -j2 --target concurrency_tests
llvm=/usr/lib/llvm-14/lib
mkdir -p build-tsan/openmp
ln -sf "$llvm/libomp.so.5" build-tsan/openmp/libgomp.so.1
LD_LIBRARY_PATH="$PWD/build-tsan/openmp" OMP_TOOL_LIBRARIES="$llvm/libarcher.so" POPART_TEST_SESSION_THREADS=2 \
  TSAN_OPTIONS="ignore_noninstrumented_modules=1:halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  build-tsan/tests/concurrency_tests --gtest_brief=1
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
