#!/usr/bin/env python3
"""Checks the line examples/infer.cpp prints (the first row's 10 probabilities for images of 0.5)
against numpy running the same MLP from the model's initializers (examples/make_mlp.py's graph).
Usage: compare_probs.py MODEL.onnx "p0 p1 ... p9" """
import sys

import numpy as np
import onnx
from onnx import numpy_helper

model = onnx.load(sys.argv[1])
w = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
image = np.full((1, 784), 0.5)
hidden = np.maximum(image @ w["w1"] + w["b1"], 0)
logits = hidden @ w["w2"] + w["b2"]
expected = np.exp(logits - logits.max())
expected /= expected.sum()
got = np.array([float(v) for v in sys.argv[2].split()])
if got.shape != (10,):
    sys.exit(f"compare_probs: expected 10 numbers, got {got.size}: {sys.argv[2]!r}")
err = np.abs(got - expected[0]).max()
if err > 1e-5:
    sys.exit(f"compare_probs: max abs difference {err:.3g} > 1e-5\n  got      {got}\n  expected {expected[0]}")
print(f"compare_probs: matches numpy (max abs difference {err:.2g})")
