#!/usr/bin/env bash
# Installs the dependencies, builds Release into build/, trains the default example (an MLP on
# Fashion-MNIST, Debian's dataset-fashion-mnist) for one epoch and reports its test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh Release
echo "== popart-run --example fashion-mnist =="
build/popart-run --example fashion-mnist --model mlp --epochs 1
