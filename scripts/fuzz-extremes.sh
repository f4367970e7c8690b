#!/usr/bin/env bash
# Runs the model fuzz target (build-san, ASan + UBSan) on every mutant tests/fuzz/extreme_mutants.py
# writes: the ONNX backend suite's small models with each attribute, folded input value and declared
# dimension set to the values where shape arithmetic and casts go wrong (near +-2^63, NaN, empty
# axes). libFuzzer reaches those rarely; this enumerates them (about 80,000 models, 15-25 min on one
# core). Lists the models that crash, with their reports, in build-san/fuzz/extremes/findings/, and
# fails if there is one. docs/fuzzing.md says more.
# Usage: scripts/fuzz-extremes.sh [FAMILY...]   (default: all; see tests/fuzz/extreme_mutants.py)
set -euo pipefail
cd "$(dirname "$0")/.."
work=build-san/fuzz/extremes
scripts/sanitize-build.sh fuzz_model
bin=build-san/tests/fuzz/fuzz_model

rm -rf "$work"
mkdir -p "$work/findings"
/usr/bin/python3 tests/fuzz/extreme_mutants.py "$work/models" "$@"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then export TMPDIR=/dev/shm; fi
findings=0
total=0
for family in "$work"/models/*/; do
  family=${family%/}
  mapfile -t files < <(find "$family" -name '*.onnx' | sort)
  n=${#files[@]}
  total=$((total + n))
  i=0
  # libFuzzer runs the files it is given one after the other and stops at the first crash: run
  # batches, and after a crash go on from the file after the one that crashed.
  while ((i < n)); do
    batch=("${files[@]:i:300}")
    log=$work/batch.log
    if "$bin" -rss_limit_mb=2048 -timeout=30 "${batch[@]}" >"$log" 2>&1; then
      i=$((i + ${#batch[@]}))
      continue
    fi
    crashed=$(grep -o '^Running: .*' "$log" | tail -n 1 | sed 's/^Running: //')
    j=0
    while ((j < ${#batch[@]})) && [[ ${batch[j]} != "$crashed" ]]; do j=$((j + 1)); done
    if ((j == ${#batch[@]})); then # no file named: the target itself failed
      echo "fuzz_model failed outside an input; log: $log" >&2
      exit 1
    fi
    findings=$((findings + 1))
    cp "$crashed" "$work/findings/"
    cp "$log" "$work/findings/$(basename "$crashed").log"
    echo "finding: $crashed: $(grep -m 1 -E 'runtime error|ERROR: (AddressSanitizer|libFuzzer)' "$log" || true)"
    i=$((i + j + 1))
  done
  echo "$(basename "$family"): $n models replayed"
done
echo "== $total models, $findings finding(s)$( ((findings == 0)) || echo " in $work/findings/")"
((findings == 0))
