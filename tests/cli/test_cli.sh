#!/usr/bin/env bash
# Command-line tests of popart-run, bad input included. Usage: test_cli.sh POPART_RUN SOURCE_DIR
set -uo pipefail
RUN="$1"
SRC="$2"
DATA=/usr/share/libonnx-testdata/data
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0
passes=0

# shellcheck source=expect.sh
source "$(dirname "${BASH_SOURCE[0]}")/expect.sh"

# A test folder of the suite: outputs compared with the expected ones.
expect 0 "PASSED" -- "$RUN" "$DATA/node/test_relu/model.onnx" --data-dir "$DATA/node/test_relu/test_data_set_0"
expect 0 "worst abs error" -- "$RUN" "$DATA/node/test_add_bcast/model.onnx" --data-dir "$DATA/node/test_add_bcast"
# Random inputs, outputs printed with shape and dtype, timing with --iterations.
expect 0 "y: FLOAT \[3,4,5\]" -- "$RUN" "$DATA/node/test_relu/model.onnx"
expect 0 "throughput: [0-9.]+ samples/s" -- "$RUN" "$DATA/node/test_relu/model.onnx" --iterations 5
# Inputs from files, outputs saved.
"$RUN" "$DATA/node/test_relu/model.onnx" --save-outputs "$TMP/out" >/dev/null 2>&1
expect 0 "y: FLOAT \[3,4,5\]" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "x=$TMP/out/y.npy"
expect 0 "PASSED" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "x=$DATA/node/test_relu/test_data_set_0/input_0.pb" --data-dir "$DATA/node/test_relu/test_data_set_0"
# A mismatch exits non-zero: compare relu's output against another test's expected data.
mkdir -p "$TMP/wrong" && cp "$DATA/node/test_relu/test_data_set_0/input_0.pb" "$TMP/wrong/input_0.pb"
cp "$DATA/node/test_abs/test_data_set_0/output_0.pb" "$TMP/wrong/output_0.pb"
expect 1 "MISMATCH" -- "$RUN" "$DATA/node/test_relu/model.onnx" --data-dir "$TMP/wrong"
# The IR dump shows the op with its inferred output shape.
expect 0 "ai.onnx::Relu-.* -> \(y : FLOAT\[3,4,5\]\)" -- "$RUN" "$DATA/node/test_relu/model.onnx" --dump-ir
expect 0 "\| ai.onnx \| Relu \|" -- "$RUN" --list-ops
# Symbolic batch: --batch fixes it.
expect 0 "probs: FLOAT \[3,10\]" -- "$RUN" "$SRC/examples/mlp.onnx" --batch 3
expect 2 "error: input 'image' has symbolic shape \[\?,784\]: give it with --input or set --batch" -- "$RUN" "$SRC/examples/mlp.onnx"
# Which kernel runs each op and why; kernel settings as flags.
expect 0 "Gather .*: reference \(oneDNN: no kernel for Gather\)" -- "$RUN" "$DATA/node/test_gather_0/model.onnx" --explain-kernels
expect 0 "MatMul .*: oneDNN, operands Pointwise, forced" -- "$RUN" "$DATA/node/test_matmul_2d/model.onnx" --explain-kernels --matmul-tuning p
expect 0 "\[debug\] Gather .*: reference \(oneDNN: no kernel for Gather\)" -- env POPART_LOG_LEVEL=debug "$RUN" "$DATA/node/test_gather_0/model.onnx"
expect 2 "--matmul-tuning: x not in" -- "$RUN" "$DATA/node/test_matmul_2d/model.onnx" --matmul-tuning x
expect 2 "--convpool-chunk" -- "$RUN" "$DATA/node/test_relu/model.onnx" --convpool-chunk -1
# Log level from the environment.
expect 0 "\[popart\] \[debug\] compiled" -- env POPART_LOG_LEVEL=debug "$RUN" "$DATA/node/test_relu/model.onnx"
# Bad input: one line on stderr, status 2.
expect 2 "error: model file '.*missing.onnx' does not exist" -- "$RUN" "$TMP/missing.onnx"
head -c 20 "$DATA/node/test_relu/model.onnx" >"$TMP/truncated.onnx"
expect 2 "error: model '.*truncated.onnx' is not a valid ONNX ModelProto" -- "$RUN" "$TMP/truncated.onnx"
echo "garbage" >"$TMP/garbage.onnx"
expect 2 "error: model '.*garbage.onnx' is not a valid ONNX ModelProto" -- "$RUN" "$TMP/garbage.onnx"
expect 2 "error: --input names 'nope'" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "nope=$TMP/out/y.npy"
expect 2 "error: input 'x' has shape" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "x=$DATA/node/test_matmul_2d/test_data_set_0/input_0.pb"
expect 2 "error: .*must be NAME=FILE" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "noequals"
expect 2 "error: cannot open .npy file" -- "$RUN" "$DATA/node/test_relu/model.onnx" --input "x=$TMP/none.npy"
expect 2 "--iterations" -- "$RUN" "$DATA/node/test_relu/model.onnx" --iterations -3

# Training: a model with its loss inside the graph, a dataset of .npy files.
/usr/bin/python3 "$SRC/tests/cli/make_train_model.py" "$TMP"
M="$TMP/train_mlp.onnx"
D=(--input "x=$TMP/x.npy" --input "y=$TMP/y.npy")
expect 0 "throughput: [0-9.]+ samples/s" -- "$RUN" "$M" --train "${D[@]}" --optimizer adamw --lr 0.01
expect 0 "10 steps \(10 per epoch\)" -- "$RUN" "$M" --train "${D[@]}"
expect 0 "30 steps" -- "$RUN" "$M" --train "${D[@]}" --epochs 3 --shuffle --lr-schedule cosine --warmup-steps 3
expect 0 "x 2 accumulated, 5 steps" -- "$RUN" "$M" --train "${D[@]}" --accumulate 2 --clip-norm 1 --loss-scaling 128
expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --optimizer lamb --loss-scaling dynamic --steps 4
expect 0 "ai.graphcore::AdamUpdate-" -- "$RUN" "$M" --train "${D[@]}" --optimizer adamw --steps 1 --dump-ir
expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --steps 2 --no-fusion
expect 0 "_recomputed" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --recompute all --dump-ir
expect 2 "recompute: most not in" -- "$RUN" "$M" --train "${D[@]}" --recompute most
expect 2 "error: --recompute needs --train" -- "$RUN" "$M" --recompute standard
# The pass manager: the pipelines listed, passes disabled or dumped by name, unknown names refused.
expect 0 "^training pipeline:" -- "$RUN" --passes
expect 0 "^  [0-9]+\. fuseMatMulBias: " -- "$RUN" --passes
expect 0 "IR after pass removeDeadCode:" -- "$RUN" "$DATA/node/test_relu/model.onnx" --dump-ir-after removeDeadCode
expect 0 "^IR after pass fuseRelu:" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --dump-ir-after fuseRelu --verify-ir
expect 0 "fused[{][^}]*Relu" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --dump-ir-after fuseRelu
expect 0 "ai.onnx::Relu-" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --dump-ir-after fuseRelu --disable-pass fuseRelu
expect 0 "ai.onnx::Relu-" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --dump-ir --no-fusion
expect 2 "error: unknown pass 'fuseNothing' \(known passes: inferShapes, " -- "$RUN" "$DATA/node/test_relu/model.onnx" --disable-pass fuseNothing
expect 2 "error: unknown pass 'nope'" -- "$RUN" "$M" --train "${D[@]}" --dump-ir-after nope
expect 2 "error: pass 'buildGradients' cannot be disabled" -- "$RUN" "$M" --train "${D[@]}" --disable-pass buildGradients
expect 0 "^compile time per pass \([0-9.]+ ms in all\):" -- "$RUN" "$M" --train "${D[@]}" --steps 2 --profile "$TMP/passes.json"
expect 0 "^ +[0-9.]+ ms  fuseMatMulBias \(1 rewrites\)" -- "$RUN" "$M" --train "${D[@]}" --steps 2 --profile "$TMP/passes.json"
expect 0 "^ +- +fuseRelu \(disabled\)" -- "$RUN" "$M" --train "${D[@]}" --steps 2 --profile "$TMP/passes.json" --disable-pass fuseRelu
for o in sgd adam adamax lambnobias rmsprop adagrad; do
  expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --optimizer "$o" --steps 3
done
expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --optimizer rmsprop --centered --momentum 0.5 --steps 3
expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --momentum 0.9 --nesterov --lr-schedule step --lr-step-size 2
# Every float initializer is accounted for on the first line: the Dropout ratio has no gradient.
expect 0 "trained 3 of 4 weights" -- "$RUN" "$M" --train "${D[@]}" --steps 1
expect 0 "^  not trained: ratio \(no gradient reaches it from loss 'loss': only ops without one lie between\)" -- "$RUN" "$M" --train "${D[@]}" --steps 1
expect 0 "^  not trained: w1, b1 \(frozen by --freeze 'w1\|b1'\)" -- "$RUN" "$M" --train "${D[@]}" --steps 1 --freeze 'w1|b1'
expect 2 "error: --freeze 'w3' matches no floating-point initializer" -- "$RUN" "$M" --train "${D[@]}" --freeze w3
# A weight read by Shape is trained; a symbolic batch needs --batch (named as the flag).
S="$TMP/train_shape.onnx"
expect 0 "trained 2 of 2 weights" -- "$RUN" "$S" --train "${D[@]}" --batch 4 --steps 2
expect 2 "error: input 'x' has shape \[\?,8\]: training needs every input shape \(give --batch N\)" -- "$RUN" "$S" --train "${D[@]}"
# The trained model is an ONNX model that runs for inference.
expect 0 "saved" -- "$RUN" "$M" --train "${D[@]}" --steps 4 --save "$TMP/trained.onnx"
expect 0 "loss: FLOAT \[\]" -- "$RUN" "$TMP/trained.onnx" --input "x=$TMP/x4.npy" --input "y=$TMP/y4.npy"
# A resumed run ends bit-identical to one that never stopped (shuffling and dropout included).
common=(--train "${D[@]}" --optimizer adam --shuffle --seed 3)
"$RUN" "$M" "${common[@]}" --steps 20 --save "$TMP/whole.onnx" >/dev/null 2>&1
"$RUN" "$M" "${common[@]}" --steps 7 --checkpoint "$TMP/ck" >/dev/null 2>&1 ||
  { echo "FAIL: the first half of the resumed run"; failures=$((failures + 1)); }
expect 0 "resuming at step 7" -- "$RUN" "$M" "${common[@]}" --steps 20 --resume "$TMP/ck" --save "$TMP/resumed.onnx"
if cmp -s "$TMP/whole.onnx" "$TMP/resumed.onnx"; then passes=$((passes + 1)); else
  echo "FAIL: resumed training differs from uninterrupted training"; failures=$((failures + 1)); fi
# The profiler: a Chrome trace with one span per op run, a per-op summary and a memory report.
expect 0 "by op type:" -- "$RUN" "$DATA/node/test_relu/model.onnx" --iterations 3 --profile "$TMP/infer.json"
# --kernels fast allows only the fast kernels, and says so where an op has none.
expect 2 "Relu #0: no fast kernel supports this op with inputs \(FLOAT\[3,4,5\]\), and the session allows only fast kernels" -- "$RUN" "$DATA/node/test_relu/model.onnx" --kernels fast
expect 0 "PASSED" -- "$RUN" "$DATA/node/test_add_bcast/model.onnx" --kernels fast --data-dir "$DATA/node/test_add_bcast/test_data_set_0"
# It names the op types that ran reference (plain-loop) kernels, with their share of op time.
expect 0 "reference kernels: [0-9.]+% of op time \(Gather [0-9.]+%\)" -- "$RUN" "$DATA/node/test_gather_0/model.onnx" --iterations 3 --profile "$TMP/gather.json"
expect 0 "reference kernels: 0.0% of op time$" -- "$RUN" "$DATA/node/test_relu/model.onnx" --iterations 3 --profile "$TMP/infer.json"
expect 0 "memory: planned peak [0-9.]* MB: activation arena .*kernels .*weights .*optimiser state" -- "$RUN" "$M" --train "${D[@]}" --optimizer adam --steps 3 --profile "$TMP/train.json"
if /usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['traceEvents']; assert len(t) == 3 and t[0]['ph'] == 'X' and t[0]['name'].startswith('Relu')" "$TMP/infer.json" &&
   /usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['traceEvents']; assert any('AdamUpdate' in e['cat'] for e in t)" "$TMP/train.json"; then
  passes=$((passes + 1)); else echo "FAIL: profile traces are not the expected Chrome traces"; failures=$((failures + 1)); fi
# Mixed precision (docs/precision.md): bf16 data as a uint16 .npy of bit patterns or a TensorProto .pb.
/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.array([[0x3f80, 0xc000, 0x7f80, 0], [0x4040]*4, [0x3e80]*4], np.uint16))" "$TMP/bf16.npy"
expect 0 "output: FLOAT \[3,4\] \[1, -2, inf, 0, 3" -- "$RUN" "$DATA/node/test_cast_BFLOAT16_to_FLOAT/model.onnx" --input "input=$TMP/bf16.npy"
expect 0 "PASSED" -- "$RUN" "$DATA/node/test_cast_BFLOAT16_to_FLOAT/model.onnx" --input "input=$DATA/node/test_cast_BFLOAT16_to_FLOAT/test_data_set_0/input_0.pb" --data-dir "$DATA/node/test_cast_BFLOAT16_to_FLOAT/test_data_set_0"
expect 0 "weights: all [0-9]+ elements changed" -- "$RUN" "$M" --train "${D[@]}" --precision bf16 --save "$TMP/bf16.onnx"
expect 0 "final loss" -- "$RUN" "$TMP/bf16.onnx" --train "${D[@]}" --steps 2 --precision fp16.32
expect 2 "precision: fp8 not in" -- "$RUN" "$M" --train "${D[@]}" --precision fp8
expect 2 "error: --save-precision needs --save" -- "$RUN" "$M" --train "${D[@]}" --save-precision fp32
# Training flags that make no sense.
expect 2 "error: --steps and --epochs exclude each other" -- "$RUN" "$M" --train "${D[@]}" --steps 2 --epochs 1
expect 2 "error: --nesterov does not apply to --optimizer adam" -- "$RUN" "$M" --train "${D[@]}" --optimizer adam --nesterov
expect 2 "error: --nesterov needs a positive --momentum" -- "$RUN" "$M" --train "${D[@]}" --nesterov
expect 2 "error: --lr needs --train" -- "$RUN" "$M" --lr 0.1
expect 2 "error: --iterations applies to inference" -- "$RUN" "$M" --train "${D[@]}" --iterations 3
expect 2 "error: --checkpoint-every needs --checkpoint" -- "$RUN" "$M" --train "${D[@]}" --checkpoint-every 2
expect 2 "error: --loss-scaling must be a positive number" -- "$RUN" "$M" --train "${D[@]}" --loss-scaling abc
expect 2 "error: model input 'y' has no dataset" -- "$RUN" "$M" --train --input "x=$TMP/x.npy"
expect 2 "error: --input y has 30 samples" -- "$RUN" "$M" --train --input "x=$TMP/x.npy" --input "y=$TMP/y_short.npy"
expect 2 "error: --input x is INT64" -- "$RUN" "$M" --train --input "x=$TMP/y.npy" --input "y=$TMP/y.npy"
expect 2 "error: loss 'nope' is not a tensor" -- "$RUN" "$M" --train "${D[@]}" --loss nope
expect 2 "error: --resume: the checkpoint .* was made with .*this run differs" -- "$RUN" "$M" --train "${D[@]}" --optimizer adam --shuffle --seed 4 --steps 20 --resume "$TMP/ck"
expect 2 "error: --resume: .*progress.txt' is missing" -- "$RUN" "$M" --train "${D[@]}" --resume "$TMP/nowhere"

# --check-numerics: the first NaN or inf names the op, tensor, step and element and stops.
/usr/bin/python3 - "$TMP" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
x = np.ones((3, 4, 5), np.float32)
x.flat[7] = -1.0
np.save(f"{out}/log_negative.npy", x)
# train_mlp's dataset with a second batch (samples 4-7) whose loss is finite (~1e36) but whose
# gradients overflow at a loss scale of 65536.
big = np.load(f"{out}/x.npy")[:12].copy()
big[4:8] = 1e35
np.save(f"{out}/x_big.npy", big)
np.save(f"{out}/y_big.npy", np.load(f"{out}/y.npy")[:12])
PY
expect 2 "error: floating-point check failed at step 1: output 'y' of Log .*\(Log\) holds -?nan at element 7 \(--check-numerics\)" -- "$RUN" "$DATA/node/test_log/model.onnx" --input "x=$TMP/log_negative.npy" --check-numerics
expect 0 "y: FLOAT \[3,4,5\]" -- "$RUN" "$DATA/node/test_relu/model.onnx" --check-numerics
BIG=(--input "x=$TMP/x_big.npy" --input "y=$TMP/y_big.npy")
expect 0 "skipped 1 steps with non-finite gradients; loss scale now 32768" -- "$RUN" "$M" --train "${BIG[@]}" --steps 3 --loss-scaling dynamic
expect 0 "^skipped step 2$" -- "$RUN" "$M" --train "${BIG[@]}" --steps 3 --loss-scaling dynamic --check-numerics
expect 2 "error: floating-point check failed at step 2: .* holds inf" -- "$RUN" "$M" --train "${BIG[@]}" --steps 3 --loss-scaling 65536 --check-numerics
expect 0 "final loss" -- "$RUN" "$M" --train "${D[@]}" --steps 3 --check-numerics

echo "cli: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
