#!/usr/bin/env bash
# Installs the dependencies, builds Release into build/ and runs the default example model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh Release
echo "== popart-run examples/mlp.onnx =="
build/popart-run examples/mlp.onnx --batch 32 --iterations 20
