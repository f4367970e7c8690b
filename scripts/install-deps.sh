#!/usr/bin/env bash
# Installs the Debian packages the project needs; idempotent and quiet.
# Usage: scripts/install-deps.sh [--test]   (--test adds the packages the tests use)
set -euo pipefail
packages=(cmake g++ make ccache libonnx-dev libprotobuf-dev protobuf-compiler libdnnl-dev
  libspdlog-dev libgtest-dev libcli11-dev nlohmann-json3-dev zlib1g-dev dataset-fashion-mnist
  openmpi-bin libopenmpi-dev dpkg-dev file)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(libonnx-testdata python3-onnx python3-numpy python3-torch python3-torchvision libopenblas0-pthread
    clang-tidy libomp-dev pkg-config clang libfuzzer-14-dev)
fi
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO=sudo; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
