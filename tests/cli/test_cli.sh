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

expect() { # expect STATUS PATTERN -- command...
  local want="$1" pattern="$2"
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [[ $status -ne $want ]] || ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $* -> status $status (want $want), output:"
    echo "$out" | head -20
    echo "  (expected pattern: $pattern)"
    failures=$((failures + 1))
  else
    passes=$((passes + 1))
  fi
}

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

echo "cli: $passes passed, $failures failed"
[[ $failures -eq 0 ]]
