#!/usr/bin/env bash
# Soak test (issue 23, item 3): trains a small MLP for STEPS steps (default 10000) with
# build/tests/soak_train and checks, from its samples every SAMPLE_EVERY steps:
#   - resident set: after the warm-up (the first WARMUP steps, default a tenth, at least 50) it
#     grows by no more than 1% over its value at the end of the warm-up;
#   - open file descriptors and threads: never more than at the end of the warm-up;
#   - determinism: a second run of min(1000, STEPS/2) steps has the same losses, bit for bit,
#     as the first run's first steps.
# Usage: scripts/soak.sh [STEPS]
# Environment: SOAK_BIN (the program; default build/tests/soak_train), SAMPLE_EVERY (default
# STEPS/100, at least 10), WARMUP, SOAK_THREADS (default 0: every core), SOAK_DIR (where the
# samples and losses are kept; default a temporary folder, removed on success).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-10000}"
[[ "$steps" =~ ^[0-9]+$ && "$steps" -ge 20 ]] || { echo "soak.sh: STEPS must be a number of at least 20, got '$steps'" >&2; exit 2; }
bin="${SOAK_BIN:-build/tests/soak_train}"
[[ -x "$bin" ]] || { echo "soak.sh: '$bin' not found: build first (scripts/build.sh) or set SOAK_BIN" >&2; exit 2; }
every="${SAMPLE_EVERY:-$(( steps / 100 > 10 ? steps / 100 : 10 ))}"
warmup="${WARMUP:-$(( steps / 10 > 50 ? steps / 10 : 50 ))}"
second=$(( steps / 2 < 1000 ? steps / 2 : 1000 ))
threads="${SOAK_THREADS:-0}"
keep=1
dir="${SOAK_DIR:-}"
if [[ -z "$dir" ]]; then dir="$(mktemp -d)"; keep=0; fi
mkdir -p "$dir"

echo "soak: $steps steps (samples every $every, warm-up $warmup), then $second steps again"
start=$SECONDS
"$bin" "$steps" "$dir/loss1.txt" "$every" "$threads" > "$dir/samples1.txt"
first_time=$(( SECONDS - start ))
"$bin" "$second" "$dir/loss2.txt" "$every" "$threads" > "$dir/samples2.txt"

status=0
/usr/bin/python3 - "$dir" "$warmup" "$second" "$first_time" <<'EOF' || status=$?
import sys
folder, warmup, second, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
samples = [tuple(int(v) for v in line.split()[1:]) for line in open(f"{folder}/samples1.txt") if line.startswith("sample ")]
base = [s for s in samples if s[0] <= warmup]
after = [s for s in samples if s[0] > warmup]
if not base or not after:
    sys.exit(f"soak: too few samples ({len(samples)}) around the warm-up at step {warmup}")
b = base[-1]
failures = []
peak = max(after, key=lambda s: s[1])
growth = (peak[1] - b[1]) / b[1]
print(f"RSS: {b[1]} kB at step {b[0]} (end of warm-up), peak after it {peak[1]} kB at step {peak[0]} "
      f"({100 * growth:+.2f}%), last {after[-1][1]} kB at step {after[-1][0]}")
if growth > 0.01:
    failures.append(f"RSS grew by {100 * growth:.2f}% after the warm-up (limit 1%)")
for col, name in ((2, "file descriptors"), (3, "threads")):
    most = max(s[col] for s in after)
    print(f"{name}: {b[col]} at step {b[0]}, at most {most} after it, {after[-1][col]} at the end")
    if most > b[col]:
        failures.append(f"{name} grew from {b[col]} to {most}")
one = open(f"{folder}/loss1.txt").read().split()
two = open(f"{folder}/loss2.txt").read().split()
if len(two) != second or len(one) < second:
    failures.append(f"loss files have {len(one)} and {len(two)} lines, expected at least {second} and {second}")
else:
    diff = next((i for i in range(second) if one[i] != two[i]), None)
    if diff is None:
        print(f"determinism: the second run's {second} losses equal the first run's bit for bit "
              f"(loss {float.fromhex(one[0]):.6g} at step 1, {float.fromhex(one[-1]):.6g} at step {len(one)})")
    else:
        failures.append(f"determinism: step {diff + 1}'s loss is {one[diff]} in the first run and {two[diff]} in the second")
print(f"first run: {len(one)} steps in {seconds} s")
if failures:
    for f in failures:
        print("FAILED:", f)
    sys.exit(1)
print("soak: passed")
EOF
if [[ $status -ne 0 ]]; then
  echo "soak: samples and losses kept in $dir"
  exit "$status"
fi
[[ $keep -eq 1 ]] || rm -rf "$dir"
