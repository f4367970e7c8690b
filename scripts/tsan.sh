#!/usr/bin/env bash
# Builds the concurrent-sessions test alone under ThreadSanitizer (build-tsan) and runs it with two
# OpenMP threads per session (docs/threads.md). LLVM's OpenMP runtime replaces Debian's libgomp,
# which is not built for TSan (it reports its thread pool's hand-offs as races): libomp implements
# libgomp's ABI, and its Archer tool tells TSan about each parallel region's fork, join and
# barriers. Needs `scripts/install-deps.sh --test` (libomp-14-dev). Extra arguments go to the test.
set -euo pipefail
cd "$(dirname "$0")/.."
CCACHE_BASEDIR="$PWD" cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DPOPART_SANITIZE=thread >/dev/null
cmake --build build-tsan -j2 --target concurrency_tests
llvm=/usr/lib/llvm-14/lib
mkdir -p build-tsan/openmp
ln -sf "$llvm/libomp.so.5" build-tsan/openmp/libgomp.so.1
LD_LIBRARY_PATH="$PWD/build-tsan/openmp" OMP_TOOL_LIBRARIES="$llvm/libarcher.so" \
  POPART_TEST_SESSION_THREADS="${POPART_TEST_SESSION_THREADS:-2}" \
  TSAN_OPTIONS="ignore_noninstrumented_modules=1:halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
  build-tsan/tests/concurrency_tests --gtest_brief=1 "$@"
