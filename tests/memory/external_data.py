#!/usr/bin/env python3
"""A model whose large initializer is stored as ONNX external data (written by the onnx package)
runs under popart-run and matches numpy; with --memory-limit below its planned size it is refused
with a message giving the size, which cannot be less than the initializer's own bytes.

Usage: external_data.py --popart-run PATH [--rows R] [--cols C] [--keep DIR]
With --keep the model stays in DIR (for measuring the peak RSS of loading it)."""
import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_model(folder, rows, cols):
    rng = np.random.default_rng(7)
    w = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    b = rng.uniform(-1, 1, (cols,)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "external_data",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, cols])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = os.path.join(folder, "model.onnx")
    # Initializers of at least w's size go to weights.bin: w does, b stays inline.
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=w.nbytes)
    stored = onnx.load(path, load_external_data=False).graph.initializer
    assert [t.name for t in stored if t.data_location == TensorProto.EXTERNAL] == ["w"], "w is not external"
    x = rng.uniform(-1, 1, (2, rows)).astype(np.float32)
    np.save(os.path.join(folder, "x.npy"), x)
    return path, x @ w + b, w.nbytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--popart-run", required=True)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--keep")
    args = ap.parse_args()
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        return check(args, args.keep)
    with tempfile.TemporaryDirectory(prefix="popart-external-") as folder:
        return check(args, folder)


def check(args, folder):
    path, expected, weight_bytes = write_model(folder, args.rows, args.cols)
    x = os.path.join(folder, "x.npy")
    out = os.path.join(folder, "out")
    failures = 0

    run = subprocess.run([args.popart_run, path, "--input", "x=" + x, "--save-outputs", out],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print("FAIL: popart-run exited", run.returncode, run.stderr)
        failures += 1
    else:
        y = np.load(os.path.join(out, "y.npy"))
        err = float(np.max(np.abs(y - expected)))
        # float32 sums of `rows` products of values in [-1, 1]: rounding grows like sqrt(rows).
        tol = 1e-5 * np.sqrt(args.rows) * 4
        print(f"external data: {weight_bytes} bytes of weights, max |popart - numpy| = {err:.3g} (tolerance {tol:.3g})")
        if not err <= tol:
            print("FAIL: outputs differ from numpy")
            failures += 1

    limit = weight_bytes // 2
    run = subprocess.run([args.popart_run, path, "--input", "x=" + x, "--memory-limit", str(limit)],
                         capture_output=True, text=True)
    m = re.search(r"needs [0-9.]+ MB \(([0-9]+) bytes: .*weights and constants.*above the limit of [0-9.]+ MB \(" +
                  str(limit) + r" bytes\) set by --memory-limit", run.stderr)
    if run.returncode == 0 or not m:
        print("FAIL: --memory-limit", limit, "was not refused as expected: exit", run.returncode, run.stderr)
        failures += 1
    elif int(m.group(1)) < weight_bytes:
        print("FAIL: the planned size", m.group(1), "is below the weights' own", weight_bytes, "bytes")
        failures += 1
    else:
        print(f"--memory-limit {limit}: refused, planned {m.group(1)} bytes")

    print("external_data: FAILED" if failures else "external_data: PASSED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
