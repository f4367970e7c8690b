#!/usr/bin/env python3
"""The example custom-op plugins through popart-run --custom-op-lib: a model that uses both
(MatMul, com.example LeakyRelu, MatMul, com.example Cube) against a numpy forward, five SGD steps
against numpy's hand-written backward and SGD, and the command line's refusals.
Usage: test_custom_op_cli.py POPART_RUN LEAKY_RELU_LIB CUBE_LIB"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

RUN, LEAKY, CUBE = sys.argv[1:4]
LIBS = ["--custom-op-lib", LEAKY, "--custom-op-lib", CUBE]
N, D, H, C = 4, 8, 16, 6
ALPHA, SCALE, LR, STEPS = 0.1, 0.5, 0.05, 5

rng = np.random.default_rng(11)
x = rng.standard_normal((N, D)).astype(np.float32)
y = rng.integers(0, C, N).astype(np.int64)
w1 = (rng.standard_normal((D, H)) * 0.5).astype(np.float32)
w2 = (rng.standard_normal((H, C)) * 0.5).astype(np.float32)

failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


def model(path, train):
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("LeakyRelu", ["h0"], ["h1"], domain="com.example", alpha=ALPHA),
        helper.make_node("MatMul", ["h1", "w2"], ["z"]),
        helper.make_node("Cube", ["z"], ["logits"], domain="com.example", scale=SCALE),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, D])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [N, C])]
    if train:
        nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"))
        inputs.append(helper.make_tensor_value_info("y", TensorProto.INT64, [N]))
        outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    graph = helper.make_graph(nodes, "custom_ops", inputs, outputs,
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    onnx.save(m, path)


def forward(a, b):
    """The activations in float64: h0, h1, z, logits."""
    h0 = x.astype(np.float64) @ a
    h1 = np.where(h0 >= 0, h0, ALPHA * h0)
    z = h1 @ b
    return h0, h1, z, SCALE * z ** 3


def sgd(a, b):
    """STEPS steps of plain SGD on the mean softmax cross-entropy, with the backward by hand."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    for _ in range(STEPS):
        h0, h1, z, logits = forward(a, b)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dlogits = (p - np.eye(C)[y]) / N
        dz = dlogits * 3 * SCALE * z ** 2
        db = h1.T @ dz
        dh0 = (dz @ b.T) * np.where(h0 >= 0, 1.0, ALPHA)
        da = x.T.astype(np.float64) @ dh0
        a, b = a - LR * da, b - LR * db
    return a, b


def popart_run(*args):
    r = subprocess.run([RUN, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


with tempfile.TemporaryDirectory() as tmp:
    np.save(os.path.join(tmp, "x.npy"), x)
    np.save(os.path.join(tmp, "y.npy"), y)
    fwd, train = os.path.join(tmp, "forward.onnx"), os.path.join(tmp, "train.onnx")
    model(fwd, False)
    model(train, True)

    # Forward against numpy.
    out = os.path.join(tmp, "out")
    status, text = popart_run(fwd, *LIBS, "--input", "x=" + os.path.join(tmp, "x.npy"), "--save-outputs", out)
    check(status == 0, "forward runs (" + text.strip().splitlines()[-1] + ")")
    if status == 0:
        got = np.load(os.path.join(out, "logits.npy"))
        want = forward(w1.astype(np.float64), w2.astype(np.float64))[3]
        err = np.max(np.abs(got - want) / (1 + np.abs(want)))
        check(err < 1e-5, f"forward matches numpy (worst relative error {err:.2e})")

    # Training: five SGD steps on the one batch, weights against numpy's.
    saved = os.path.join(tmp, "trained.onnx")
    status, text = popart_run(train, *LIBS, "--train", "--input", "x=" + os.path.join(tmp, "x.npy"), "--input",
                              "y=" + os.path.join(tmp, "y.npy"), "--steps", str(STEPS), "--lr", str(LR),
                              "--save", saved)
    check(status == 0 and "final loss" in text, "training runs: " + (text if status else "final loss printed"))
    if status == 0:
        trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(saved).graph.initializer}
        ra, rb = sgd(w1, w2)
        for name, want, start in (("w1", ra, w1), ("w2", rb, w2)):
            err = np.max(np.abs(trained[name] - want) / (1e-3 + np.abs(want - start)).max())
            moved = np.max(np.abs(trained[name] - start))
            check(err < 1e-3 and moved > 1e-3,
                  f"{name} after {STEPS} steps matches numpy's SGD (error {err:.2e} of its movement, moved {moved:.3g})")

    # Refusals, with exit status 2 and the reason.
    status, text = popart_run(fwd, "--input", "x=" + os.path.join(tmp, "x.npy"))
    check(status == 2 and "unsupported op com.example::LeakyRelu" in text, "without the library: " + text.strip())
    status, text = popart_run(fwd, "--custom-op-lib", os.path.join(tmp, "nope.so"))
    check(status == 2 and re.search(r"custom op library '.*nope.so': cannot load it", text) is not None,
          "a missing library: " + text.strip())
    status, text = popart_run(fwd, "--custom-op-lib", os.path.join(tmp, "x.npy"))
    check(status == 2 and "cannot load it" in text, "a file that is no library: " + text.strip())
    # --list-ops lists the plugins' ops with their gradients.
    status, text = popart_run(*LIBS, "--list-ops")
    check(status == 0 and re.search(r"\| com.example \| Cube \| 1\+ \| reference \| yes \|", text) is not None
          and re.search(r"\| com.example \| LeakyRelu \| 1\+ \| reference \| yes \|", text) is not None,
          "--list-ops lists the plugins' ops")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
