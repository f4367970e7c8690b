#!/usr/bin/python3
"""PyTorch parity tests of `popart-run --train`.

For every case (model x optimiser configuration) this script, in a temporary directory:
  1. builds a small torch module with a fixed seed, wrapped so that forward(inputs..., target)
     returns the scalar loss, and exports it with torch.onnx.export in training mode
     (no constant folding, parameters as initializers);
  2. writes a dataset (steps x batch samples per input) as .npy files;
  3. trains the torch module for a few steps from the exported initializers with the same
     data order and the torch.optim optimiser (LAMB: the reference below);
  4. trains the exported model with `popart-run --train ... --save out.onnx` and compares every
     trained weight and BatchNorm running statistic in out.onnx with torch's.

Nothing is committed but this script: models and references are generated at test time with
Debian's python3-torch. Exits nonzero on any mismatch.

Usage: parity.py --popart-run PATH [--filter SUBSTR] [--keep DIR] [--verbose] [--torch-only]
                 [--forward] [--sensitivity]
  --torch-only   export and train in torch only; with --verbose prints ops and initializers
  --forward      also compare popart-run's inference loss on the first batch with torch's
  --sensitivity  retrain in torch with one setting changed at a time and print how many
                 tolerances that moves the weights (shows what the comparison can detect)
"""

import argparse
import collections
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

OPSET = 14  # BatchNormalization's training_mode attribute needs opset >= 14.
STEPS = 5
RTOL = 1e-4
ATOL = 1e-5


# ----------------------------------------------------------------------------------------------
# Models. Each returns logits; WithLoss adds the loss so that it is inside the exported graph.


class MLP(nn.Module):
    """32-64-10 perceptron with ReLU, cross-entropy over 10 classes."""

    batch = 8

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    @staticmethod
    def dataset(rng, samples):
        x = rng.standard_normal((samples, 32)).astype(np.float32)
        target = rng.integers(0, 10, size=(samples,)).astype(np.int64)
        return {"x": x, "target": target}

    @staticmethod
    def loss(logits, target):
        return F.cross_entropy(logits, target)


class CNN(nn.Module):
    """conv-BN(training)-ReLU-maxpool, conv-ReLU-avgpool, linear; cross-entropy over 10."""

    batch = 4

    def __init__(self):
        super().__init__()
        # No bias before BatchNorm: its gradient is zero in exact arithmetic, so adaptive
        # optimisers would turn rounding noise into full-size updates.
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)  # 8x8 -> 4x4
        x = F.avg_pool2d(torch.relu(self.conv2(x)), 2)  # 4x4 -> 2x2
        return self.fc(torch.flatten(x, 1))

    @staticmethod
    def dataset(rng, samples):
        x = rng.standard_normal((samples, 3, 8, 8)).astype(np.float32)
        target = rng.integers(0, 10, size=(samples,)).astype(np.int64)
        return {"x": x, "target": target}

    @staticmethod
    def loss(logits, target):
        return F.cross_entropy(logits, target)


class Transformer(nn.Module):
    """One pre-LN transformer encoder block over token embeddings: embedding Gather plus a
    learnt position table, layer norm, 2-head self-attention with softmax, GELU feed-forward,
    and a vocabulary head; cross-entropy per token. Written out by hand (no dropout) so the
    export is plain ops."""

    batch, seq, vocab, dim, heads, ffn = 2, 6, 16, 16, 2, 32

    def __init__(self):
        super().__init__()
        d = self.dim
        self.embed = nn.Embedding(self.vocab, d)
        self.pos = nn.Parameter(0.1 * torch.randn(self.seq, d))
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)
        # No key bias: softmax over keys is invariant to it, so its gradient is zero in exact
        # arithmetic (and pure rounding noise in practice).
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, self.ffn)
        self.ff2 = nn.Linear(self.ffn, d)
        self.head = nn.Linear(d, self.vocab)

    def forward(self, tokens):
        b, s, h = self.batch, self.seq, self.heads
        dh = self.dim // h
        x = self.embed(tokens) + self.pos
        y = self.ln1(x)

        def split(t):  # [b, s, d] -> [b, h, s, dh]
            return t.reshape(b, s, h, dh).transpose(1, 2)

        q, k, v = split(self.q(y)), split(self.k(y)), split(self.v(y))
        att = torch.softmax(torch.matmul(q, k.transpose(2, 3)) / math.sqrt(dh), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, s, self.dim)
        x = x + self.o(y)
        x = x + self.ff2(F.gelu(self.ff1(self.ln2(x))))
        return self.head(x)

    @classmethod
    def dataset(cls, rng, samples):
        tokens = rng.integers(0, cls.vocab, size=(samples, cls.seq)).astype(np.int64)
        target = rng.integers(0, cls.vocab, size=(samples, cls.seq)).astype(np.int64)
        return {"tokens": tokens, "target": target}

    @classmethod
    def loss(cls, logits, target):
        return F.cross_entropy(logits.reshape(-1, cls.vocab), target.reshape(-1))


class Transformer17(Transformer):
    """The same block exported at opset 17, where nn.LayerNorm becomes one LayerNormalization op."""
    opset = 17


class ShapeOf(nn.Module):
    """h = x W; h2 = Reshape(h, Shape(h)); logits = h2 V: the five-node pattern whose first weight
    was once frozen silently because a Shape op read h. Exported with a symbolic batch, so that
    h.reshape(h.shape) becomes Shape -> Gather/Unsqueeze/Concat -> Reshape."""

    batch = 8
    dynamic_batch = True

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(0.3 * torch.randn(12, 16))
        self.V = nn.Parameter(0.3 * torch.randn(16, 5))

    def forward(self, x):
        h = x @ self.W
        return h.reshape(h.shape) @ self.V

    @staticmethod
    def dataset(rng, samples):
        x = rng.standard_normal((samples, 12)).astype(np.float32)
        target = rng.integers(0, 5, size=(samples,)).astype(np.int64)
        return {"x": x, "target": target}

    @staticmethod
    def loss(logits, target):
        return F.cross_entropy(logits, target)


class Chunk(nn.Module):
    """A gated linear unit: torch.chunk exports Slices whose bounds are computed from Shape."""

    batch = 8

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 24)
        self.out = nn.Linear(12, 5)

    def forward(self, x):
        a, b = self.fc(x).chunk(2, dim=-1)
        return self.out(a * torch.sigmoid(b))

    dataset = staticmethod(ShapeOf.dataset)
    loss = staticmethod(ShapeOf.loss)


class MHA(nn.Module):
    """nn.MultiheadAttention (2 heads, packed in_proj weight) over token embeddings, mean-pooled,
    then a linear classifier: its export computes head shapes from Shape ops."""

    batch, seq, vocab, dim, classes = 4, 6, 16, 16, 5
    dynamic_batch = True

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.dim)
        self.attn = nn.MultiheadAttention(self.dim, 2, batch_first=True)
        self.head = nn.Linear(self.dim, self.classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.head((x + y).mean(dim=1))

    @classmethod
    def dataset(cls, rng, samples):
        tokens = rng.integers(0, cls.vocab, size=(samples, cls.seq)).astype(np.int64)
        target = rng.integers(0, cls.classes, size=(samples,)).astype(np.int64)
        return {"tokens": tokens, "target": target}

    loss = staticmethod(ShapeOf.loss)


class MHANoBias(MHA):
    """MHA without projection biases. Softmax over keys is invariant to the key bias, so its
    gradient is rounding noise, which Adam's normalisation turns into full-size steps that no two
    implementations share: the AdamW case drops the biases (the SGD case keeps them)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(self.dim, 2, batch_first=True, bias=False)


class LSTMClassifier(nn.Module):
    """Token embedding -> 2-layer nn.LSTM (batch_first, exported as one LSTM op per layer with
    Transposes around them) -> the last layer's final hidden state -> Linear -> cross-entropy."""

    batch, seq, vocab, dim, hidden, classes = 4, 7, 16, 8, 12, 5

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(self.vocab, self.dim)
        self.lstm = nn.LSTM(self.dim, self.hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(self.hidden, self.classes)

    def forward(self, tokens):
        _, (h, _) = self.lstm(self.embed(tokens))
        return self.head(h[-1])

    @classmethod
    def dataset(cls, rng, samples):
        tokens = rng.integers(0, cls.vocab, size=(samples, cls.seq)).astype(np.int64)
        target = rng.integers(0, cls.classes, size=(samples,)).astype(np.int64)
        return {"tokens": tokens, "target": target}

    @staticmethod
    def loss(logits, target):
        return F.cross_entropy(logits, target)


class GRUClassifier(nn.Module):
    """Dense sequence [seq, batch, features] -> bidirectional nn.GRU (linear_before_reset=1 in
    the export) whose every output step feeds a mean, plus both final hidden states -> Linear ->
    cross-entropy: Y and Y_h both get gradients."""

    batch, seq, features, hidden, classes = 4, 6, 5, 10, 3

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(self.features, self.hidden, bidirectional=True)
        self.head = nn.Linear(4 * self.hidden, self.classes)

    def forward(self, x):
        y, h = self.gru(x.transpose(0, 1))
        return self.head(torch.cat([y.mean(0), h[0], h[1]], dim=1))

    @classmethod
    def dataset(cls, rng, samples):
        x = rng.standard_normal((samples, cls.seq, cls.features)).astype(np.float32)
        target = rng.integers(0, cls.classes, size=(samples,)).astype(np.int64)
        return {"x": x, "target": target}

    @staticmethod
    def loss(logits, target):
        return F.cross_entropy(logits, target)


@torch.jit.script
def recurrence(x, W, U):
    """h_t = tanh(x_t U + h_{t-1} W) over x's axis 1: scripted, so the export keeps the for loop
    as an ONNX Loop whose body reads U and W from the outer graph."""
    h = torch.zeros(x.size(0), W.size(1))
    for t in range(x.size(1)):
        h = torch.tanh(x[:, t] @ U + h @ W)
    return h


class RNNLoop(nn.Module):
    """A recurrence written as a loop (an ONNX Loop with a trip count known at compile time),
    then a linear classifier: U and W are used only inside the Loop body, which training unrolls."""

    batch, seq, features, hidden, classes = 4, 5, 6, 8, 5

    def __init__(self):
        super().__init__()
        self.U = nn.Parameter(0.4 * torch.randn(self.features, self.hidden))
        self.W = nn.Parameter(0.3 * torch.randn(self.hidden, self.hidden))
        self.head = nn.Linear(self.hidden, self.classes)

    def forward(self, x):
        return self.head(recurrence(x, self.W, self.U))

    @classmethod
    def dataset(cls, rng, samples):
        x = rng.standard_normal((samples, cls.seq, cls.features)).astype(np.float32)
        target = rng.integers(0, cls.classes, size=(samples,)).astype(np.int64)
        return {"x": x, "target": target}

    loss = staticmethod(ShapeOf.loss)


MODELS = {"mlp": MLP, "cnn": CNN, "transformer": Transformer, "transformer17": Transformer17,
          "shapeof": ShapeOf, "chunk": Chunk, "mha": MHA, "mhanobias": MHANoBias,
          "lstm": LSTMClassifier, "gru": GRUClassifier, "rnnloop": RNNLoop}


class WithLoss(nn.Module):
    """forward(inputs..., target) -> scalar loss."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, *args):
        *inputs, target = args
        return self.net.loss(self.net(*inputs), target)


# ----------------------------------------------------------------------------------------------
# LAMB reference (the definition): m, v as Adam, with (lamb) or without (lambnobias)
# bias correction; u = m^/(sqrt(v^)+eps) + wd*w; w -= lr * (phi(|w|)/|u|) * u per weight tensor,
# with phi(|w|) = min(|w|, max_weight_norm) when max_weight_norm > 0, ratio 1 when either
# norm is 0.


class Lamb(torch.optim.Optimizer):
    def __init__(self, params, lr, betas, eps, weight_decay=0.0, bias_correction=True,
                 max_weight_norm=0.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, max_weight_norm=max_weight_norm)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, g = state["m"], state["v"], p.grad
                m.mul_(beta1).add_(g, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
                if group["bias_correction"]:
                    m_hat = m / (1 - beta1 ** state["step"])
                    v_hat = v / (1 - beta2 ** state["step"])
                else:
                    m_hat, v_hat = m, v
                u = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm = p.norm()
                if group["max_weight_norm"] > 0:
                    w_norm = torch.clamp(w_norm, max=group["max_weight_norm"])
                u_norm = u.norm()
                ratio = 1.0 if w_norm == 0 or u_norm == 0 else (w_norm / u_norm).item()
                p.add_(u, alpha=-group["lr"] * ratio)


# ----------------------------------------------------------------------------------------------
# Cases: one optimiser configuration drives both the torch optimiser and the command line.


Case = collections.namedtuple("Case", "name model opt hyper accumulate clip loss_scaling precision")


def case(model, opt, tag="", accumulate=1, clip=0.0, loss_scaling=None, precision="fp32", **hyper):
    name = f"{model}-{opt}" + (f"-{tag}" if tag else "") + (f"-{precision}" if precision != "fp32" else "")
    return Case(name, model, opt, hyper, accumulate, clip, loss_scaling, precision)


SGD_MOMENTUM = dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
ADAMW = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)

CASES = [
    case("mlp", "sgd", "momentum", **SGD_MOMENTUM),
    case("mlp", "sgd", "nesterov", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    case("mlp", "adam", "l2", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01),
    case("mlp", "adamw", **ADAMW),
    case("mlp", "adamax", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01),
    case("mlp", "lamb", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1),
    case("mlp", "lamb", "maxnorm", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1,
         max_weight_norm=1.0),
    case("mlp", "lambnobias", lr=0.05, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.3),
    case("mlp", "rmsprop", lr=0.005, alpha=0.9, eps=1e-8, weight_decay=0.01),
    case("mlp", "rmsprop", "centered-momentum", lr=0.005, alpha=0.9, eps=1e-8, momentum=0.5,
         centered=True),
    case("mlp", "adagrad", lr=0.05, eps=1e-10, weight_decay=0.01),
    case("mlp", "adagrad", "decay-init", lr=0.05, eps=1e-10, lr_decay=0.5, initial_accumulator=0.1),
    case("mlp", "sgd", "scale-clip-accum", accumulate=2, clip=0.5, loss_scaling=1024.0,
         **SGD_MOMENTUM),
    case("mlp", "adam", "scale-clip-accum", accumulate=2, clip=0.5, loss_scaling=1024.0,
         lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8),
    case("cnn", "sgd", "momentum", **SGD_MOMENTUM),
    case("cnn", "adamw", **ADAMW),
    case("transformer", "sgd", "momentum", **SGD_MOMENTUM),
    case("transformer", "adamw", **ADAMW),
    case("transformer", "lamb", lr=0.01, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.1),
    case("transformer17", "adamw", **ADAMW),
    case("shapeof", "sgd", "momentum", **SGD_MOMENTUM),
    case("chunk", "adamw", **ADAMW),
    case("mha", "sgd", "momentum", **SGD_MOMENTUM),
    case("mhanobias", "adamw", **ADAMW),
    case("lstm", "sgd", "momentum", **SGD_MOMENTUM),
    case("lstm", "adamw", **ADAMW),
    case("gru", "sgd", "momentum", **SGD_MOMENTUM),
    case("gru", "adamw", **ADAMW),
    case("rnnloop", "sgd", "momentum", **SGD_MOMENTUM),
    case("rnnloop", "adamw", **ADAMW),
    # Mixed precision (docs/precision.md): bf16 against torch.autocast("cpu", torch.bfloat16),
    # fp16.32 against torch in fp32 (torch 1.13 has no fp16 matmul on the CPU); compared by
    # PRECISION_TOLERANCES instead of RTOL/ATOL.
    case("mlp", "sgd", "momentum", precision="bf16", **SGD_MOMENTUM),
    case("mlp", "adamw", precision="bf16", **ADAMW),
    case("cnn", "sgd", "momentum", precision="bf16", **SGD_MOMENTUM),
    case("transformer", "adamw", precision="bf16", **ADAMW),
    case("mlp", "sgd", "momentum", precision="fp16.32", **SGD_MOMENTUM),
    case("cnn", "adamw", precision="fp16.32", **ADAMW),
    case("transformer", "adamw", precision="fp16.32", **ADAMW),
]

# Mixed-precision cases: (loss of every step, relative; weights: ||got - want|| / ||want - initial||
# per tensor, i.e. the error in units of how far torch's training moved the tensor. A norm, not a
# maximum: Adam's step is about lr whatever the gradient's size, so an element whose tiny gradient
# rounds to the other sign moves 2 lr the other way in either run.) bf16 weights may also be twice
# torch's bf16-vs-fp32 distance away (compare_mixed_precision): torch's bf16 on a CPU without
# AVX-512 rounds in other places than ours, and the CNN's BatchNorm bias lands 0.17 away.
PRECISION_TOLERANCES = {"bf16": (0.01, 0.15), "fp16.32": (0.01, 0.1)}


def torch_optimizer(c, params):
    h = c.hyper
    betas = (h.get("beta1", 0.9), h.get("beta2", 0.999))
    wd = h.get("weight_decay", 0.0)
    if c.opt == "sgd":
        return torch.optim.SGD(params, lr=h["lr"], momentum=h.get("momentum", 0.0),
                               dampening=h.get("dampening", 0.0), weight_decay=wd,
                               nesterov=h.get("nesterov", False))
    if c.opt == "adam":
        return torch.optim.Adam(params, lr=h["lr"], betas=betas, eps=h["eps"], weight_decay=wd)
    if c.opt == "adamw":
        return torch.optim.AdamW(params, lr=h["lr"], betas=betas, eps=h["eps"], weight_decay=wd)
    if c.opt == "adamax":
        return torch.optim.Adamax(params, lr=h["lr"], betas=betas, eps=h["eps"], weight_decay=wd)
    if c.opt in ("lamb", "lambnobias"):
        return Lamb(params, lr=h["lr"], betas=betas, eps=h["eps"], weight_decay=wd,
                    bias_correction=c.opt == "lamb", max_weight_norm=h.get("max_weight_norm", 0.0))
    if c.opt == "rmsprop":
        return torch.optim.RMSprop(params, lr=h["lr"], alpha=h["alpha"], eps=h["eps"],
                                   weight_decay=wd, momentum=h.get("momentum", 0.0),
                                   centered=h.get("centered", False))
    if c.opt == "adagrad":
        return torch.optim.Adagrad(params, lr=h["lr"], lr_decay=h.get("lr_decay", 0.0),
                                   weight_decay=wd, initial_accumulator_value=h.get("initial_accumulator", 0.0),
                                   eps=h["eps"])
    raise ValueError(f"unknown optimiser {c.opt}")


def cli_arguments(c):
    args = ["--train", "--verify-ir", "--optimizer", c.opt]
    for key, value in c.hyper.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            if value:
                args.append(flag)
        else:
            args += [flag, repr(value)]
    if c.loss_scaling is not None:
        args += ["--loss-scaling", repr(c.loss_scaling)]
    if c.precision != "fp32":  # compared with torch's fp32 weights: save the master copies
        args += ["--precision", c.precision, "--save-precision", "fp32"]
    if c.clip:
        args += ["--clip-norm", repr(c.clip)]
    if getattr(MODELS[c.model], "dynamic_batch", False):
        args += ["--batch", str(MODELS[c.model].batch)]
    if c.accumulate > 1:
        # The dataset holds exactly STEPS updates; rely on the one-epoch default for --steps.
        args += ["--accumulate", str(c.accumulate)]
    else:
        args += ["--steps", str(STEPS)]
    return args


# ----------------------------------------------------------------------------------------------


def export(wrapper, example, input_names, path, opset=OPSET, dynamic_batch=False):
    """With dynamic_batch every input's leading dimension is symbolic, so that shapes derived
    from it are computed by Shape ops in the graph (popart-run then needs --batch)."""
    dynamic_axes = {name: {0: "batch"} for name in input_names} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(example), path, export_params=True,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          opset_version=opset, input_names=input_names, output_names=["loss"],
                          keep_initializers_as_inputs=False, dynamic_axes=dynamic_axes)


def float_state(module):
    """Float tensors of the state dict (parameters and BatchNorm running statistics)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()
            if v.dtype.is_floating_point}


def read_initializers(path):
    model = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def op_summary(path):
    model = onnx.load(path)
    ops = collections.Counter(n.op_type for n in model.graph.node)
    return ", ".join(f"{op}x{n}" if n > 1 else op for op, n in sorted(ops.items()))


class Failure(Exception):
    pass


def train_torch(c, wrapper, data):
    """Trains \p wrapper in place for STEPS updates of case \p c on \p data; each update
    consumes c.accumulate consecutive batches and uses the mean of their gradients. Returns the
    trained float state, the loss of every micro-batch and how many updates were clipped."""
    batch = MODELS[c.model].batch
    params = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer = torch_optimizer(c, params)
    tensors = [torch.from_numpy(a) for a in data.values()]
    clipped = 0
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(c.accumulate):
            k = step * c.accumulate + micro
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.precision == "bf16"):
                loss = wrapper(*[t[k * batch:(k + 1) * batch] for t in tensors])
            losses.append(loss.item())
            (loss / c.accumulate).backward()
        if c.clip:
            norm = torch.nn.utils.clip_grad_norm_(params, c.clip)
            clipped += int(norm > c.clip)
        optimizer.step()
    return float_state(wrapper), losses, clipped


def sensitivity(c, state0, data):
    """Shows that the tolerance separates this case from its neighbours: retrains in torch with
    one setting changed at a time and prints the largest difference in units of the tolerance
    (below 1: the comparison could not tell that setting's effect from rounding)."""
    variants = {}
    for key, value in c.hyper.items():
        if isinstance(value, bool):
            variants[f"{key}={not value}"] = c._replace(hyper=dict(c.hyper, **{key: not value}))
        elif key in ("lr", "beta1", "beta2", "alpha"):
            variants[f"{key}*0.9"] = c._replace(hyper=dict(c.hyper, **{key: value * 0.9}))
        else:
            variants[f"{key}=0"] = c._replace(hyper=dict(c.hyper, **{key: 0.0}))
    if c.clip:
        variants["no clipping"] = c._replace(clip=0.0)
    if c.opt in ("lamb", "lambnobias"):
        other = "lambnobias" if c.opt == "lamb" else "lamb"
        variants[other] = c._replace(opt=other)
    if c.opt in ("adam", "adamw") and c.hyper.get("weight_decay"):
        other = "adam" if c.opt == "adamw" else "adamw"
        variants[other] = c._replace(opt=other)
    reference, _, _ = train_torch(c, fresh_module(c, state0), data)
    for label, variant in variants.items():
        if variant.opt == "sgd" and variant.hyper.get("nesterov") and (
                not variant.hyper.get("momentum") or variant.hyper.get("dampening")):
            continue  # torch rejects Nesterov without momentum or with dampening.
        trained, _, _ = train_torch(variant, fresh_module(c, state0), data)
        # A NaN (say 0/0 with eps=0) counts as an infinite difference.
        worst, name = max((float(np.nan_to_num(np.max(
            np.abs(trained[k].numpy() - reference[k].numpy()) /
            (ATOL + RTOL * np.abs(reference[k].numpy()))), nan=np.inf)), k) for k in reference)
        flag = "" if worst > 1 else "  <- within tolerance"
        print(f"  sensitivity {label}: {worst:.3g} x tolerance ({name}){flag}")


def fresh_module(c, state):
    torch.manual_seed(1234)
    wrapper = WithLoss(MODELS[c.model]())
    wrapper.train()
    with torch.no_grad():
        for k, v in wrapper.state_dict().items():
            if k in state:
                v.copy_(state[k])
    return wrapper


def forward_check(args, model_path, data, batch, torch_loss, workdir):
    """Runs popart-run in inference on the first batch and compares the loss with torch's."""
    files = []
    for name, array in data.items():
        path = os.path.join(workdir, f"{name}_first_batch.npy")
        np.save(path, array[:batch])
        files += ["--input", f"{name}={path}"]
    out_dir = os.path.join(workdir, "forward")
    command = [args.popart_run, model_path, "--verify-ir"] + files + ["--save-outputs", out_dir]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise Failure(f"popart-run (inference) exited with {result.returncode}:\n  "
                      f"{' '.join(command)}\n{result.stdout}{result.stderr}")
    loss = float(np.load(os.path.join(out_dir, "loss.npy")))
    close = abs(loss - torch_loss) <= 1e-5 * abs(torch_loss)  # False for a NaN loss, unlike "> bound"
    if args.verbose or not close:
        print(f"  forward loss: popart-run {loss:.7f}, torch {torch_loss:.7f}")
    if not close:
        raise Failure("the first forward loss differs")


def run_case(c, args, workdir):
    """Returns a list of (weight, max abs err, max rel err, ok) rows; raises Failure."""
    net_cls = MODELS[c.model]
    torch.manual_seed(1234)
    wrapper = WithLoss(net_cls())
    wrapper.train()

    rng = np.random.default_rng(4321)
    batch = net_cls.batch
    micro_batches = STEPS * c.accumulate
    data = net_cls.dataset(rng, micro_batches * batch)
    input_names = list(data.keys())
    example = [torch.from_numpy(a[:batch]) for a in data.values()]

    model_path = os.path.join(workdir, "model.onnx")
    dynamic_batch = getattr(net_cls, "dynamic_batch", False)
    export(wrapper, example, input_names, model_path, getattr(net_cls, "opset", OPSET), dynamic_batch)
    initial = read_initializers(model_path)
    state = float_state(wrapper)

    # The exported initializers must be exactly the torch state, by name.
    missing = [k for k in state if k not in initial]
    if missing:
        raise Failure(f"state_dict entries without an initializer of the same name: {missing}; "
                      f"initializers: {sorted(initial)}")
    extra = sorted(k for k in initial if k not in state)
    # Tracing ran one forward pass in training mode, which moved the BatchNorm running
    # statistics; start torch from exactly the exported values.
    with torch.no_grad():
        sd = wrapper.state_dict()
        for k in state:
            sd[k].copy_(torch.from_numpy(initial[k].copy()))
    state0 = float_state(wrapper)
    if args.verbose:
        print(f"  ops: {op_summary(model_path)}")
        print(f"  initializers: {', '.join(sorted(initial))}")
        if extra:
            print(f"  initializers that are not state_dict entries: {extra}")

    input_files = []
    for name, array in data.items():
        path = os.path.join(workdir, f"{name}.npy")
        np.save(path, array)
        input_files += ["--input", f"{name}={path}"]

    expected, losses, clipped = train_torch(c, wrapper, data)
    if c.clip and not clipped:
        raise Failure(f"clip norm {c.clip} never clipped; choose a smaller one")
    if args.sensitivity:
        sensitivity(c, state0, data)
    with torch.no_grad():  # Leave the module as exported for later trainings.
        for k, v in wrapper.state_dict().items():
            if k in state0:
                v.copy_(state0[k])
    if args.verbose:
        print(f"  torch losses: {' '.join(f'{v:.5f}' for v in losses)}")
    for k, v in expected.items():
        if torch.equal(v, state0[k]):
            raise Failure(f"torch training left {k} unchanged, so the comparison cannot fail")

    if args.forward:
        forward_check(args, model_path, data, batch, losses[0], workdir)
    if args.torch_only:
        return []

    out_path = os.path.join(workdir, "out.onnx")
    command = [args.popart_run, model_path] + cli_arguments(c) + input_files + ["--save", out_path]
    if args.verbose:
        print("  " + " ".join(command))
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if args.verbose:
        print(f"  popart-run: {time.time() - started:.2f} s")
        if result.stdout.strip():
            print("  | " + result.stdout.strip().replace("\n", "\n  | "))
    if result.returncode != 0:
        raise Failure(f"popart-run exited with {result.returncode}:\n  {' '.join(command)}\n"
                      f"{result.stdout}{result.stderr}")
    trained = read_initializers(out_path)
    if c.precision != "fp32":
        fp32 = None
        if c.precision == "bf16":
            fp32, _, _ = train_torch(c._replace(precision="fp32"), fresh_module(c, state0), data)
        return compare_mixed_precision(c, result.stdout, losses, expected, trained, state0, fp32)

    rows = []
    for k, want in expected.items():
        if k not in trained:
            raise Failure(f"{out_path} has no initializer {k}; it has {sorted(trained)}")
        got = trained[k].astype(np.float64)
        want = want.numpy().astype(np.float64)
        if got.shape != want.shape:
            raise Failure(f"{k}: shape {got.shape}, torch {want.shape}")
        diff = np.abs(got - want)
        ok = bool(np.all(diff <= ATOL + RTOL * np.abs(want)))
        rel = float(np.max(diff / np.maximum(np.abs(want), 1e-30)))
        moved = float(np.max(np.abs(want - state0[k].numpy())))
        rows.append((k, float(diff.max()), rel, moved, ok))
    for k in extra:  # Non-parameter initializers must come back unchanged.
        if k in trained and not np.array_equal(trained[k], initial[k]):
            rows.append((k + " (not a parameter, changed)",
                         float(np.max(np.abs(trained[k].astype(np.float64) - initial[k]))),
                         float("nan"), 0.0, False))
    return rows


def compare_mixed_precision(c, stdout, losses, expected, trained, state0, fp32=None):
    """Rows of a mixed-precision case: the loss of each step within the relative tolerance, and
    each weight within the tolerance in units of how far torch moved it. With \\p fp32 (torch's
    float32 training of the same case), a weight may also be up to twice as far from torch's
    result as torch's own float32 result is: two implementations that round to bf16 in different
    places (oneDNN's bf16 kernels, or fp32 rounded once where a CPU lacks them; torch's varies by
    CPU too) are each about that far from float32, in directions of their own."""
    loss_rtol, weight_tol = PRECISION_TOLERANCES[c.precision]
    ours = [float(m) for m in re.findall(r"^step \d+/\d+ loss (\S+)", stdout, re.M)]
    if len(ours) != len(losses):
        raise Failure(f"popart-run printed {len(ours)} step losses, torch has {len(losses)}:\n{stdout}")
    rows = []
    for k, (got, want) in enumerate(zip(ours, losses)):
        rel = abs(got - want) / abs(want)
        rows.append((f"loss of step {k + 1} ({got:.5f}, torch {want:.5f})", abs(got - want), rel, 0.0,
                     rel <= loss_rtol))
    for k, want in expected.items():
        got = trained[k].astype(np.float64)
        want = want.numpy().astype(np.float64)
        moved = float(np.linalg.norm(want - state0[k].numpy()))
        err = float(np.linalg.norm(got - want))
        tol = weight_tol * moved
        if fp32 is not None:
            tol = max(tol, 2 * float(np.linalg.norm(fp32[k].numpy().astype(np.float64) - want)))
        rows.append((k, err, err / moved, moved, err <= tol))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--popart-run", default="build/popart-run", help="popart-run binary")
    parser.add_argument("--filter", default="", help="run only cases whose name contains this")
    parser.add_argument("--keep", help="keep the artefacts of each case in DIR/<case>")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--torch-only", action="store_true",
                        help="export and train in torch only (no popart-run --train)")
    parser.add_argument("--sensitivity", action="store_true",
                        help="show how far each case is, in tolerances, from its neighbours")
    parser.add_argument("--forward", action="store_true",
                        help="also compare popart-run's inference loss on the first batch")
    args = parser.parse_args()
    torch.set_num_threads(1)

    cases = [c for c in CASES if args.filter in c.name]
    if not cases:
        sys.exit(f"no case matches '{args.filter}'")
    if (args.forward or not args.torch_only) and not os.access(args.popart_run, os.X_OK):
        sys.exit(f"popart-run '{args.popart_run}' is not executable")

    failures = []
    started = time.time()
    for c in cases:
        print(f"{c.name}:", flush=True)
        if args.keep:
            workdir = os.path.join(args.keep, c.name)
            shutil.rmtree(workdir, ignore_errors=True)
            os.makedirs(workdir)
        else:
            workdir = tempfile.mkdtemp(prefix=f"parity-{c.name}-")
        try:
            rows = run_case(c, args, workdir)
        except (Failure, subprocess.TimeoutExpired) as e:
            print(f"  FAIL: {e}")
            failures.append(c.name)
            continue
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        bad = [r for r in rows if not r[4]]
        for name, abs_err, rel_err, moved, ok in rows:
            if args.verbose or not ok:
                print(f"  {'ok  ' if ok else 'FAIL'} {name}: max abs err {abs_err:.3g}, "
                      f"max rel err {rel_err:.3g} (trained by up to {moved:.3g})")
        if bad:
            failures.append(c.name)
        elif rows:
            worst = max(rows, key=lambda r: r[1])
            print(f"  ok: {len(rows)} tensors, worst {worst[0]} max abs err {worst[1]:.3g}")
        else:
            print("  torch side ok")
    print(f"{len(cases) - len(failures)}/{len(cases)} cases passed in {time.time() - started:.1f} s"
          f" (rtol {RTOL}, atol {ATOL}, {STEPS} steps)")
    if failures:
        print("FAILED: " + " ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
