#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) in build-san (clang, ASan + UBSan, -DPOPART_FUZZ=ON;
# scripts/sanitize-build.sh) and runs each one for SECONDS (default 60): first its regression
# inputs, then fuzzing from the committed seeds, the ONNX backend suite's files and the corpus earlier
# runs grew. Findings land in build-san/fuzz/artifacts/<target>/ and make the script fail.
# POPART_FUZZ_SEED fixes libFuzzer's seed (scripts/test.sh: 1, so that a CI run can be repeated);
# POPART_FUZZ_TIMEOUT is the seconds one input may take (default 10). docs/fuzzing.md says more.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]   (targets: model npy tensorproto checkpoint idx)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then targets=(model npy tensorproto checkpoint idx); fi
suite=/usr/share/libonnx-testdata/data
work=build-san/fuzz
timeout=${POPART_FUZZ_TIMEOUT:-10}
seed=()
if [[ -n ${POPART_FUZZ_SEED:-} ]]; then seed=(-seed="$POPART_FUZZ_SEED"); fi

scripts/sanitize-build.sh "${targets[@]/#/fuzz_}"

# The suite's models and tensors as extra seeds (links, not copies; large files only slow the fuzzer).
link_suite() { # $1: target, $2: file name pattern
  mkdir -p "$work/suite/$1"
  if [[ -d $suite && -z $(ls -A "$work/suite/$1") ]]; then
    find "$suite" -name "$2" -size -64k | while read -r f; do
      ln -sf "$f" "$work/suite/$1/$(echo "${f#"$suite"/}" | tr / _)"
    done
  fi
}
link_suite model model.onnx
link_suite tensorproto '*.pb'

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
# The harnesses write each input to a file for the readers that take a path: in memory if possible.
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then export TMPDIR=/dev/shm; fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
status=0
summary=()
for t in "${targets[@]}"; do
  bin=build-san/tests/fuzz/fuzz_$t
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t" "$work/suite/$t"
  # The checkpoint target's real checkpoint, in the format this build writes.
  if [[ $t == checkpoint ]]; then export POPART_FUZZ_WRITE_CHECKPOINT=$work/suite/checkpoint/current.ckpt; fi
  regressions=(tests/fuzz/regressions/"$t"/*)
  if [[ -e ${regressions[0]} ]]; then
    echo "== fuzz_$t: replaying ${#regressions[@]} regression input(s)"
    if ! "$bin" -rss_limit_mb=2048 -timeout="$timeout" "${regressions[@]}" >"$work/$t-regressions.log" 2>&1; then
      echo "fuzz_$t: a regression input fails again (log: $work/$t-regressions.log)"
      tail -40 "$work/$t-regressions.log"
      status=1
      summary+=("fuzz_$t: REGRESSION")
      continue
    fi
  fi
  echo "== fuzz_$t: fuzzing for ${seconds}s"
  set +e
  "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout="$timeout" -print_final_stats=1 "${seed[@]}" \
    -artifact_prefix="$work/artifacts/$t/" "$work/corpus/$t" "$work/suite/$t" "tests/fuzz/corpus/$t" \
    >"$work/$t.log" 2>&1
  rc=$?
  set -e
  unset POPART_FUZZ_WRITE_CHECKPOINT
  runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$work/$t.log" | grep -o "[0-9]*$" || echo "?")
  if ((rc != 0)); then
    echo "fuzz_$t: FINDING (exit status $rc; log: $work/$t.log)"
    grep -E "ERROR|runtime error|Test unit written|terminate|SUMMARY" "$work/$t.log" | head -20
    status=1
    summary+=("fuzz_$t: FINDING after $runs executions")
  else
    summary+=("fuzz_$t: $runs executions, no findings")
  fi
done
printf '%s\n' "${summary[@]}"
exit "$status"
