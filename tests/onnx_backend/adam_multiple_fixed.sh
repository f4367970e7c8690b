#!/usr/bin/env bash
# node/test_adam_multiple of ONNX 1.12 is inconsistent: its expected outputs were generated with
# epsilon = 1e-2, but its model.onnx has no epsilon attribute, so the spec's default 1e-6
# applies (onnx/onnx#7749). This runs the suite's own data against the model with the intended
# epsilon=1e-2 attribute added, so the two-tensor Adam case is still checked against the ONNX
# reference outputs. Usage: adam_multiple_fixed.sh POPART_RUN
set -euo pipefail
RUN="$1"
SRC=/usr/share/libonnx-testdata/data/node/test_adam_multiple
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
/usr/bin/python3 - "$SRC/model.onnx" "$TMP/model.onnx" <<'PY'
import sys
import onnx
from onnx import helper
model = onnx.load(sys.argv[1])
(node,) = model.graph.node
assert node.op_type == "Adam" and not any(a.name == "epsilon" for a in node.attribute), "the test was fixed upstream"
node.attribute.append(helper.make_attribute("epsilon", 1e-2))
onnx.save(model, sys.argv[2])
PY
"$RUN" "$TMP/model.onnx" --data-dir "$SRC"
