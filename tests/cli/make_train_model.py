#!/usr/bin/env python3
"""Writes a small trainable model (MLP with dropout and a cross-entropy loss inside the graph)
and a dataset for the command-line training tests. Usage: make_train_model.py OUT_DIR"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
rng = np.random.default_rng(7)
w1 = numpy_helper.from_array((rng.standard_normal((8, 16)) * 0.3).astype(np.float32), "w1")
b1 = numpy_helper.from_array(np.zeros(16, np.float32), "b1")
w2 = numpy_helper.from_array((rng.standard_normal((16, 3)) * 0.3).astype(np.float32), "w2")
ratio = numpy_helper.from_array(np.array(0.2, np.float32), "ratio")
training = numpy_helper.from_array(np.array(True), "training")
nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h0"]),
    helper.make_node("Add", ["h0", "b1"], ["h1"]),
    helper.make_node("Relu", ["h1"], ["h2"]),
    helper.make_node("Dropout", ["h2", "ratio", "training"], ["h3"]),
    helper.make_node("MatMul", ["h3", "w2"], ["logits"]),
    helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"),
]
graph = helper.make_graph(
    nodes, "train_mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
     helper.make_tensor_value_info("y", TensorProto.INT64, [4])],
    [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    [w1, b1, w2, ratio, training])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(model)
onnx.save(model, os.path.join(out, "train_mlp.onnx"))
# The five-node pattern with a symbolic batch: h is reshaped to its own Shape, which must not
# make w1 a constant; training it needs --batch.
shape_nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h"]),
    helper.make_node("Shape", ["h"], ["s"]),
    helper.make_node("Reshape", ["h", "s"], ["h2"]),
    helper.make_node("MatMul", ["h2", "w2"], ["logits"]),
    helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"),
]
shape_graph = helper.make_graph(
    shape_nodes, "train_shape",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
     helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
    [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    [w1, w2])
shape_model = helper.make_model(shape_graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(shape_model)
onnx.save(shape_model, os.path.join(out, "train_shape.onnx"))
# train_mlp without Dropout, for the replication tests (tests/cli/test_cli_mpi.sh): one process
# accumulating two micro-batches must train as two replicas of one each, which Dropout would break:
# each replica draws its own masks.
plain_graph = helper.make_graph(
    [n for n in nodes if n.op_type != "Dropout"] , "train_plain",
    graph.input, graph.output, [w1, b1, w2])
plain_graph.node[2].output[0] = "h3"
plain_model = helper.make_model(plain_graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(plain_model)
onnx.save(plain_model, os.path.join(out, "train_plain.onnx"))
# train_plain with a BatchNormalization in training mode after the first MatMul (running
# statistics bn_mean/bn_var from 0 and 1, momentum 0.9), for --replica-bn-stats.
bn_nodes = [
    helper.make_node("MatMul", ["x", "w1"], ["h0"]),
    helper.make_node("BatchNormalization", ["h0", "bn_scale", "b1", "bn_mean", "bn_var"],
                     ["h1", "bn_mean_out", "bn_var_out"], momentum=0.9, training_mode=1),
    helper.make_node("Relu", ["h1"], ["h3"]),
    helper.make_node("MatMul", ["h3", "w2"], ["logits"]),
    helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"),
]
bn_graph = helper.make_graph(
    bn_nodes, "train_bn", graph.input, graph.output,
    [w1, b1, w2, numpy_helper.from_array(np.ones(16, np.float32), "bn_scale"),
     numpy_helper.from_array(np.zeros(16, np.float32), "bn_mean"),
     numpy_helper.from_array(np.ones(16, np.float32), "bn_var")])
bn_model = helper.make_model(bn_graph, opset_imports=[helper.make_opsetid("", 15)])
onnx.checker.check_model(bn_model)
onnx.save(bn_model, os.path.join(out, "train_bn.onnx"))
x = rng.standard_normal((40, 8)).astype(np.float32)
y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0.5).astype(np.int64)
np.save(os.path.join(out, "x.npy"), x)
np.save(os.path.join(out, "y.npy"), y)
np.save(os.path.join(out, "y_short.npy"), y[:30])
np.save(os.path.join(out, "x4.npy"), x[:4])
np.save(os.path.join(out, "y4.npy"), y[:4])
# 42 samples: global batches of 8 leave 2 of each epoch out.
x42 = rng.standard_normal((42, 8)).astype(np.float32)
np.save(os.path.join(out, "x42.npy"), x42)
np.save(os.path.join(out, "y42.npy"), (x42[:, 0] > 0).astype(np.int64) + (x42[:, 1] > 0.5).astype(np.int64))
