#!/usr/bin/env bash
# popart-run as data-parallel replicas (docs/distributed.md, "popart-run on many processes"):
# mpirun -np N popart-run must train as one process accumulating N micro-batches over the same
# samples, with one rank printing, and --replicas N must start mpirun itself.
# Usage: test_cli_mpi.sh POPART_RUN SOURCE_DIR MPIRUN
set -uo pipefail
RUN="$1"
SRC="$2"
MPIRUN="${3:-}"
if [[ -z "$MPIRUN" || ! -x "$MPIRUN" ]]; then
  echo "cli_mpi: mpirun not found; install openmpi-bin (scripts/install-deps.sh)" >&2
  exit 1
fi
export OMP_NUM_THREADS=1
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0

fail() {
  echo "FAIL: $1"
  failures=$((failures + 1))
}

# shellcheck source=expect.sh
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"

# Every initializer of model $1 within 1e-6 of model $2's, relative to the tensor's largest magnitude.
same_weights() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
a, b = ({i.name: numpy_helper.to_array(i).astype(np.float64) for i in onnx.load(p).graph.initializer}
        for p in sys.argv[1:3])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
bad = []
for name, x in a.items():
    y = b[name]
    scale = max(np.abs(x).max(), np.abs(y).max(), 1e-30)
    err = np.abs(x - y).max() / scale
    if not err <= 1e-6:
        bad.append(f"{name}: relative difference {err:.3g}")
print("; ".join(bad) if bad else f"{len(a)} weights equal within 1e-6")
sys.exit(1 if bad else 0)
EOF
}

# One line per pattern; $2 must occur exactly $3 times in the output file $1.
count_is() {
  local n
  n=$(grep -cE -- "$2" "$1")
  [[ "$n" -eq "$3" ]] || fail "'$2' printed $n times in $1, expected $3"
  [[ "$n" -eq "$3" ]] && passes=$((passes + 1))
}

/usr/bin/python3 "$SRC/tests/cli/make_train_model.py" "$TMP" || { echo "FAIL: make_train_model.py"; exit 1; }
M="$TMP/train_plain.onnx"
# 42 samples: with global batches of 8 the last 2 of each epoch are dropped, of 16 the last 10.
D=(--input "x=$TMP/x42.npy" --input "y=$TMP/y42.npy")

# N replicas of micro-batch 4 against one process accumulating N micro-batches of 4: the same
# samples per step (the sampler's slices in rank order), so the same weights.
check_equivalence() { # check_equivalence RANKS OPTIMISER-FLAGS...
  local ranks="$1"
  shift
  local common=("$M" --train "${D[@]}" --epochs 3 --shuffle --seed 5 "$@")
  "$RUN" "${common[@]}" --threads 1 --accumulate "$ranks" --save "$TMP/one_$ranks.onnx" >"$TMP/one_$ranks.txt" 2>&1 ||
    { fail "one process, --accumulate $ranks: $(tail -3 "$TMP/one_$ranks.txt")"; return; }
  "${MPI[@]}" -np "$ranks" "$RUN" "${common[@]}" --save "$TMP/rep_$ranks.onnx" >"$TMP/rep_$ranks.txt" 2>&1 ||
    { fail "mpirun -np $ranks: $(tail -5 "$TMP/rep_$ranks.txt")"; return; }
  if same_weights "$TMP/one_$ranks.onnx" "$TMP/rep_$ranks.onnx"; then passes=$((passes + 1)); else
    fail "$ranks replicas ($*) end with other weights than one process accumulating $ranks micro-batches"; fi
  # Only rank 0 prints, and the loss it prints is the mean over the replicas: the one process's.
  count_is "$TMP/rep_$ranks.txt" "^training " 1
  count_is "$TMP/rep_$ranks.txt" "^final loss: .* \(mean over $ranks replicas\)$" 1
  local want got
  want=$(grep -oE "^final loss: [^ ]+" "$TMP/one_$ranks.txt")
  got=$(grep -oE "^final loss: [^ ]+" "$TMP/rep_$ranks.txt")
  [[ -n "$want" && "$want" == "$got" ]] && passes=$((passes + 1)) ||
    fail "$ranks replicas print '$got', one process '$want'"
}
check_equivalence 2 --optimizer adamw --lr 0.01 --weight-decay 0.01
check_equivalence 4 --optimizer sgd --lr 0.05 --momentum 0.9
grep -qE "^training .*batch 4 x 2 replicas \(global batch 8\), 15 steps \(5 per epoch\)" "$TMP/rep_2.txt" &&
  passes=$((passes + 1)) || fail "the header of 2 replicas: $(head -1 "$TMP/rep_2.txt")"
grep -qE "^data: 42 samples, 2 global batches of 16 per epoch \(each replica takes its slice of 4\), 10 dropped per epoch" \
  "$TMP/rep_4.txt" && passes=$((passes + 1)) || fail "the sampler line of 4 replicas: $(grep ^data "$TMP/rep_4.txt")"

# --replicas N: mpirun started by popart-run itself, the replica count in the header.
expect 0 "batch 4 x 2 replicas \(global batch 8\)" -- "$RUN" "$M" --train "${D[@]}" --steps 3 --replicas 2
expect 0 "starting 2 replicas: .*mpirun --oversubscribe .*-np 2 -x OMP_NUM_THREADS=1 .* --threads 1$" -- \
  "$RUN" "$M" --train "${D[@]}" --steps 3 --replicas 2
expect 2 "error: --replicas 2 starts the replicas with mpirun .*install the package openmpi-bin" -- \
  env PATH=/nonexistent "$RUN" "$M" --train "${D[@]}" --replicas 2
expect 2 "error: --replicas trains replicas of a model: it needs --train or --example" -- "$RUN" "$M" --replicas 2
expect 2 "error: rank 0 of 2: --replicas 3 but mpirun started 2 processes" -- \
  "${MPI[@]}" -np 2 "$RUN" "$M" --train "${D[@]}" --replicas 3
expect 2 "error: rank 0 of 2: popart-run runs as one replica of an MPI job of 2 processes, and replicates training only" -- \
  "${MPI[@]}" -np 2 "$RUN" "$M"

# A rank that fails names itself, and the job ends (rank 0 waits in a collective for it).
expect 2 "error: rank 1 of 2: cannot open .npy file '.*nowhere.npy'" -- "${MPI[@]}" \
  -np 1 "$RUN" "$M" --train "${D[@]}" --steps 1000 : -np 1 "$RUN" "$M" --train --input "x=$TMP/nowhere.npy" \
  --input "y=$TMP/y42.npy" --steps 1000

# Checkpoints: rank 0 writes them; a resumed replicated run ends as the uninterrupted one; a
# checkpoint of 2 replicas resumes in 1 process with the same global batch.
common=("$M" --train "${D[@]}" --optimizer adam --shuffle --seed 3)
"${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 12 --save "$TMP/whole.onnx" >/dev/null 2>&1 ||
  fail "the uninterrupted replicated run"
"${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 7 --checkpoint "$TMP/ck" >/dev/null 2>&1 ||
  fail "the first half of the resumed replicated run"
expect 0 "resuming at step 7" -- "${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 12 --resume "$TMP/ck" \
  --save "$TMP/resumed.onnx"
if cmp -s "$TMP/whole.onnx" "$TMP/resumed.onnx"; then passes=$((passes + 1)); else
  fail "resumed replicated training differs from uninterrupted training"; fi
# Another replica count resumes with the same global batch: 1 process accumulating the 2
# replicas' micro-batches ends as the replicated run did; another global batch is refused.
expect 0 "resuming a checkpoint of 2 replica\(s\) on 1: the global batch of 8 is the same" -- \
  "$RUN" "${common[@]}" --steps 12 --accumulate 2 --resume "$TMP/ck" --save "$TMP/resumed_one.onnx"
if same_weights "$TMP/whole.onnx" "$TMP/resumed_one.onnx"; then passes=$((passes + 1)); else
  fail "a replicated checkpoint resumed by one process accumulating 2 micro-batches differs"; fi
expect 2 "error: --resume: the checkpoint in .* was made with 42 samples, 8 samples per step \(over 2 replica\(s\)\).*this run differs \(42 samples, 4 per step over 1 replica" -- \
  "$RUN" "${common[@]}" --steps 12 --resume "$TMP/ck"

# --shard-optimizer-state (every weight sharded: the model's are small): 2 replicas end as one
# process accumulating 2 micro-batches; the profile names the shards. Every rank takes part in
# saving a checkpoint (the shards are gathered to rank 0), and resuming it is bit-identical.
S=(--shard-optimizer-state --shard-min-elements 1)
common=("$M" --train "${D[@]}" --optimizer adam --lr 0.01 --epochs 3 --shuffle --seed 5)
"$RUN" "${common[@]}" --threads 1 --accumulate 2 --save "$TMP/shard_one.onnx" >"$TMP/shard_one.txt" 2>&1 ||
  fail "one process for the sharded comparison: $(tail -3 "$TMP/shard_one.txt")"
"${MPI[@]}" -np 2 "$RUN" "${common[@]}" "${S[@]}" --profile "$TMP/shard.json" --save "$TMP/shard_rep.onnx" \
  >"$TMP/shard_rep.txt" 2>&1 || fail "mpirun -np 2 --shard-optimizer-state: $(tail -5 "$TMP/shard_rep.txt")"
if same_weights "$TMP/shard_one.onnx" "$TMP/shard_rep.onnx"; then passes=$((passes + 1)); else
  fail "2 sharded replicas end with other weights than one process accumulating 2 micro-batches"; fi
count_is "$TMP/shard_rep.txt" "optimiser state \(this replica's shards\).*weight shards" 1
common=("$M" --train "${D[@]}" --optimizer adam --shuffle --seed 3 "${S[@]}")
"${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 12 --save "$TMP/shard_whole.onnx" >/dev/null 2>&1 ||
  fail "the uninterrupted sharded run"
"${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 7 --checkpoint "$TMP/shard_ck" >"$TMP/shard_ck.txt" 2>&1 ||
  fail "the first half of the resumed sharded run: $(tail -3 "$TMP/shard_ck.txt")"
expect 0 "resuming at step 7" -- "${MPI[@]}" -np 2 "$RUN" "${common[@]}" --steps 12 --resume "$TMP/shard_ck" \
  --save "$TMP/shard_resumed.onnx"
if cmp -s "$TMP/shard_whole.onnx" "$TMP/shard_resumed.onnx"; then passes=$((passes + 1)); else
  fail "resumed sharded training differs from uninterrupted sharded training"; fi
expect 2 "error: --shard-min-elements needs --shard-optimizer-state" -- \
  "$RUN" "$M" --train "${D[@]}" --steps 1 --shard-min-elements 1

# --replica-bn-stats: after one step of 2 replicas (no shuffle: replica r has rows 4r..4r+3), the
# running mean is 0.1 x the batch mean of x·w1 on rank 0's rows (local) or on all 8 rows (mean).
for stats in local mean; do
  "${MPI[@]}" -np 2 "$RUN" "$TMP/train_bn.onnx" --train "${D[@]}" --steps 1 --replica-bn-stats "$stats" \
    --save "$TMP/bn_$stats.onnx" >"$TMP/bn_$stats.txt" 2>&1 || fail "--replica-bn-stats $stats: $(tail -3 "$TMP/bn_$stats.txt")"
  if /usr/bin/python3 - "$TMP" "$stats" <<'EOF'
import sys
import numpy as np
import onnx
from onnx import numpy_helper
tmp, stats = sys.argv[1:3]
init = {i.name: numpy_helper.to_array(i) for i in onnx.load(f"{tmp}/train_bn.onnx").graph.initializer}
saved = {i.name: numpy_helper.to_array(i) for i in onnx.load(f"{tmp}/bn_{stats}.onnx").graph.initializer}
rows = np.load(f"{tmp}/x42.npy")[: 4 if stats == "local" else 8].astype(np.float64)
want = 0.1 * (rows @ init["w1"].astype(np.float64)).mean(axis=0)
err = np.abs(saved["bn_mean"] - want).max()
print(f"{stats}: running mean within {err:.3g}")
sys.exit(0 if err < 1e-5 else 1)
EOF
  then passes=$((passes + 1)); else fail "--replica-bn-stats $stats: rank 0's running mean"; fi
done

# --pipeline-stages 2 (docs/distributed.md, "Pipelining"): popart-run starts mpirun itself, the
# stages are balanced by estimate, and the loss that rank 0 prints (the last stage's, sent to every
# rank) is that of one process accumulating the same micro-batches.
P=("$M" --train "${D[@]}" --steps 6 --seed 5 --optimizer sgd --lr 0.05 --momentum 0.9 --accumulate 4)
"$RUN" "${P[@]}" --threads 1 >"$TMP/pipe_one.txt" 2>&1 || fail "one process for pipelining: $(tail -3 "$TMP/pipe_one.txt")"
"$RUN" "${P[@]}" --pipeline-stages 2 >"$TMP/pipe_two.txt" 2>&1 ||
  fail "--pipeline-stages 2: $(tail -5 "$TMP/pipe_two.txt")"
count_is "$TMP/pipe_two.txt" "^popart-run: starting 2 pipeline stages: .*mpirun .*-np 2 .*--pipeline-stages 2" 1
count_is "$TMP/pipe_two.txt" "^final loss: " 1
if /usr/bin/python3 - "$TMP/pipe_one.txt" "$TMP/pipe_two.txt" <<'EOF'
import re, sys
one, two = (float(re.search(r"^final loss: ([0-9.e+-]+)", open(p).read(), re.M).group(1)) for p in sys.argv[1:3])
print(f"final loss: one process {one}, 2 stages {two}")
sys.exit(0 if abs(one - two) <= 1e-5 * abs(one) else 1)
EOF
then passes=$((passes + 1)); else fail "2 pipeline stages end with another loss than one process"; fi
expect 2 "error: --pipeline-split needs --pipeline-stages K" -- "$RUN" "$M" --train "${D[@]}" --pipeline-split h
expect 2 "error: --save is not supported with --pipeline-stages yet" -- \
  "$RUN" "$M" --train "${D[@]}" --pipeline-stages 2 --save "$TMP/p.onnx"
expect 2 "error: rank 0 of 2: .*pipelineSplit: 'nope' is not a tensor that an op of the model produces" -- \
  "${MPI[@]}" -np 2 "$RUN" "$M" --train "${D[@]}" --accumulate 2 --pipeline-stages 2 --pipeline-split nope

# The Fashion-MNIST example goes through the sampler too; rank 0 evaluates.
if [[ -d /usr/share/datasets/fashion-mnist ]]; then
  "${MPI[@]}" -np 2 "$RUN" --example fashion-mnist --steps 30 >"$TMP/fmnist.txt" 2>&1 ||
    fail "Fashion-MNIST on 2 replicas: $(tail -5 "$TMP/fmnist.txt")"
  count_is "$TMP/fmnist.txt" "batch 64 x 2 replicas \(global batch 128\).*30 step" 1
  count_is "$TMP/fmnist.txt" "^data: 468 steps per epoch, 96 training images dropped per epoch" 1
  count_is "$TMP/fmnist.txt" "^test accuracy: [0-9.]+%" 1
else
  fail "/usr/share/datasets/fashion-mnist is missing (install dataset-fashion-mnist)"
fi

echo "cli_mpi: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
