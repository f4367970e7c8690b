#!/usr/bin/env python3
"""Writes examples/mlp.onnx: a 784-128-10 MLP classifier with softmax, batch 32, fixed seed."""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
w1 = (rng.standard_normal((784, 128)) * np.sqrt(2 / 784)).astype(np.float32)
b1 = np.zeros(128, np.float32)
w2 = (rng.standard_normal((128, 10)) * np.sqrt(2 / 128)).astype(np.float32)
b2 = np.zeros(10, np.float32)
nodes = [
    helper.make_node("MatMul", ["image", "w1"], ["h1"], name="fc1"),
    helper.make_node("Add", ["h1", "b1"], ["h1b"], name="fc1_bias"),
    helper.make_node("Relu", ["h1b"], ["a1"], name="relu1"),
    helper.make_node("Gemm", ["a1", "w2", "b2"], ["logits"], name="fc2"),
    helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
]
graph = helper.make_graph(
    nodes, "mlp",
    [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 784])],
    [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
    [numpy_helper.from_array(a, n) for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2")]])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="popart-cpu examples")
onnx.checker.check_model(model)
onnx.save(model, __file__.replace("make_mlp.py", "mlp.onnx"))
