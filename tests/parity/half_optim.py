#!/usr/bin/python3
"""PyTorch parity of optimiser updates on FLOAT16 and BFLOAT16 weights (`popart-run --train`).

Each case trains one 16-bit weight w of a model whose loss is sum(w * x): the gradient of w is
the step's x, so both sides see exactly the same given gradients (chosen representable in the
weight's type). torch.optim steps a torch.float16 / torch.bfloat16 parameter with those
gradients; popart-run trains the model with the same optimiser for the same steps and writes
the trained weight with --save.

What torch 1.13 can do on the CPU decides the cases: SGD with momentum (dampening, weight decay,
Nesterov) on float16 and bfloat16 parameters, and Adam / AdamW on bfloat16 only (its addcmul_ has
no CPU Half kernel). The cases torch cannot run are listed, not silently dropped.

Tolerance. The two do not round the same way, so neither is the other's exact reference:
- torch runs each tensor op of the update in the parameter's type: every mul_, add_, addcmul_,
  sqrt, div and addcdiv_ upcasts its inputs, computes in float and rounds its own result to 16
  bits, several roundings per stored value per step;
- popart loads each value, computes the whole update in fp32 and rounds each stored value (the
  weight and each state tensor) once per step.
Both are therefore compared with the same updates in float64 from the same 16-bit initial values
and gradients. Let u(w) be one unit in the last place of the 16-bit type at |w| (2^-10 or 2^-7
relative). Per element, after `STEPS` steps:
  1. |popart - fp64| <= |torch - fp64| + STEPS * u(w): ours may be off the exact result by its one
     rounding per step (half a unit each, and the earlier roundings carried forward, so a unit per
     step), and is allowed to be as far off as torch's own 16-bit result is;
  2. |popart - torch| <= STEPS * 4 * u(w): a sanity bound that a different formula (momentum
     missing, weight decay twice, no bias correction, ...) exceeds by a wide margin: each step
     moves the weights by lr * |g| >= 0.1 * 0.25 for SGD, 4 to 30 units of bfloat16 near 1 and 25
     to 200 of fp16;
where u(w) is taken at the largest |w| of the element's float64 trajectory (an error made while a
weight was large stays that size when it ends near 0). Each element must have moved if the float64
run moved it by more than STEPS / 2 + 1 units, so by more than half a unit in some step: a 16-bit
weight whose every step is below half a unit stays where it is (in torch as here) while the
float64 run drifts away, and torch's extra roundings sometimes move it a unit anyway. At least one
element must have moved.

Usage: half_optim.py --popart-run PATH [--keep DIR] [--verbose]
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

STEPS = 6
N = 64

ONNX_TYPE = {torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}
EPS = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16"}

# name, popart-run flags, torch optimiser factory, types torch can run on the CPU
CASES = [
    ("sgd-momentum-dampening-wd", ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--dampening", "0.1",
                                   "--weight-decay", "0.01"],
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
     (torch.float16, torch.bfloat16)),
    ("sgd-nesterov", ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.8", "--nesterov"],
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True),
     (torch.float16, torch.bfloat16)),
    ("adamw", ["--optimizer", "adamw", "--lr", "0.05", "--weight-decay", "0.5", "--beta1", "0.9", "--beta2", "0.99",
               "--eps", "1e-3"],
     lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.5, betas=(0.9, 0.99), eps=1e-3),
     (torch.bfloat16,)),
    ("adam-l2", ["--optimizer", "adam", "--lr", "0.05", "--weight-decay", "0.2", "--beta1", "0.9", "--beta2", "0.99",
                 "--eps", "1e-3"],
     lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.2, betas=(0.9, 0.99), eps=1e-3),
     (torch.bfloat16,)),
]
NOT_ON_CPU = "adamw and adam-l2 on float16: torch 1.13 has no CPU Half addcmul_"


def bits16(values, dtype):
    """The raw 16-bit words of float32 values that dtype represents exactly."""
    return torch.tensor(values, dtype=torch.float32).to(dtype).view(torch.int16).numpy().view(np.uint16)


def model(w0, dtype):
    """loss = Cast(ReduceSum(Cast(x, T) * w), FLOAT) with w: T[N] and x: FLOAT[1, N]."""
    t = ONNX_TYPE[dtype]
    w = helper.make_tensor("w", t, [N], bits16(w0, dtype).tobytes(), raw=True)
    nodes = [
        helper.make_node("Cast", ["x"], ["xt"], to=t),
        helper.make_node("Mul", ["xt", "w"], ["p"]),
        helper.make_node("ReduceSum", ["p"], ["s"], keepdims=0),
        helper.make_node("Cast", ["s"], ["loss"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "half_linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(m)
    return m


def trained_weight(path, dtype):
    """Initializer w of the saved model as float64."""
    for init in onnx.load(path).graph.initializer:
        if init.name != "w":
            continue
        words = (np.frombuffer(init.raw_data, np.uint16) if init.raw_data
                 else np.array(init.int32_data, np.uint32).astype(np.uint16))
        return torch.from_numpy(words.view(np.int16).copy()).view(dtype).double().numpy()
    raise RuntimeError(f"{path} has no initializer 'w'")


def torch_steps(make, w0, grads, dtype):
    """w after the steps in dtype; w after the steps in float64 from the same initial values and
    gradients; and the largest |w| each element of the float64 run took on the way."""
    result = []
    for t in (dtype, torch.float64):
        w = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float32).to(t))
        opt = make([w])
        largest = np.abs(w0.astype(np.float64))
        for g in grads:
            w.grad = torch.tensor(g, dtype=torch.float32).to(t)
            opt.step()
            largest = np.maximum(largest, np.abs(w.detach().double().numpy()))
        result.append(w.detach().double().numpy())
    return result[0], result[1], largest




def ulp(w, dtype):
    """One unit in the last place of dtype at |w| (normal range)."""
    return EPS[dtype] * np.exp2(np.floor(np.log2(np.maximum(np.abs(w), 2.0**-14))))


def run_case(popart_run, work, name, flags, make, dtype, verbose):
    rng = np.random.default_rng(zlib.crc32(f"{name} {NAME[dtype]}".encode()))
    # Weights of several magnitudes; gradients representable in dtype, |g| in [0.25, 2] (and a
    # few small ones), so that one step moves every weight by many units.
    w0 = torch.tensor(rng.uniform(-2, 2, N) * np.exp2(rng.integers(-2, 2, N)), dtype=torch.float32)
    w0 = w0.to(dtype).float().numpy()
    grads = []
    for _ in range(STEPS):
        g = rng.uniform(0.25, 2, N) * rng.choice([-1, 1], N)
        g[:4] *= 1e-2
        grads.append(torch.tensor(g, dtype=torch.float32).to(dtype).float().numpy())
    case_dir = os.path.join(work, f"{name}-{NAME[dtype]}")
    os.makedirs(case_dir)
    onnx.save(model(w0, dtype), os.path.join(case_dir, "model.onnx"))
    np.save(os.path.join(case_dir, "x.npy"), np.stack(grads).astype(np.float32))
    out = os.path.join(case_dir, "out.onnx")
    cmd = [popart_run, os.path.join(case_dir, "model.onnx"), "--train", "--steps", str(STEPS), "--input",
           "x=" + os.path.join(case_dir, "x.npy"), "--save", out] + flags
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return f"popart-run failed ({proc.returncode}): {proc.stderr.strip()[-400:]}\n  {' '.join(cmd)}"
    ours = trained_weight(out, dtype)
    theirs, exact, largest = torch_steps(make, w0, grads, dtype)
    # The unit is taken at the largest magnitude the weight had: rounding errors made on the way
    # stay that size when a weight ends near 0.
    unit = ulp(largest, dtype)
    our_err, torch_err = np.abs(ours - exact), np.abs(theirs - exact)
    apart = np.abs(ours - theirs)
    if verbose > 1:
        for i in range(N):
            print(f"    {i}: w0 {w0[i]!r} g {[float(g[i]) for g in grads]} ours {ours[i]!r} torch {theirs[i]!r} "
                  f"fp64 {exact[i]!r} unit {unit[i]!r}")
    if verbose:
        print(f"  {name} {NAME[dtype]}: ours-fp64 max {np.max(our_err / unit):.2f} units, torch-fp64 max "
              f"{np.max(torch_err / unit):.2f}, ours-torch max {np.max(apart / unit):.2f}; ours closer to fp64 than "
              f"torch in {np.mean(our_err < torch_err) * 100:.0f}% of elements, as close in "
              f"{np.mean(our_err == torch_err) * 100:.0f}%")
    failures = []
    bad = np.nonzero(our_err > torch_err + STEPS * unit)[0]
    if bad.size:
        i = bad[0]
        failures.append(f"{bad.size} elements further from fp64 than torch's 16-bit result + {STEPS} units; element "
                        f"{i}: ours {ours[i]!r}, torch {theirs[i]!r}, fp64 {exact[i]!r}")
    bad = np.nonzero(apart > 4 * STEPS * unit)[0]
    if bad.size:
        i = bad[0]
        failures.append(f"{bad.size} elements more than {4 * STEPS} units from torch; element {i}: ours {ours[i]!r}, "
                        f"torch {theirs[i]!r}")
    still = np.nonzero((ours == w0) & (np.abs(exact - w0) > (STEPS / 2 + 1) * unit))[0]
    if still.size:
        failures.append(f"{still.size} elements did not move whose float64 run moved {STEPS / 2 + 1} units "
                        f"(first {still[0]})")
    if np.all(ours == w0):
        failures.append("no element moved")
    return "; ".join(failures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popart-run", required=True)
    parser.add_argument("--keep", help="keep models and data in this directory")
    parser.add_argument("--verbose", "-v", action="count", default=0, help="once: errors per case; twice: per element")
    args = parser.parse_args()
    torch.manual_seed(0)
    work = args.keep or tempfile.mkdtemp(prefix="half_optim_")
    os.makedirs(work, exist_ok=True)
    failed = 0
    try:
        for name, flags, make, dtypes in CASES:
            for dtype in dtypes:
                error = run_case(args.popart_run, work, name, flags, make, dtype, args.verbose)
                print(f"{'FAIL' if error else 'ok'}   {name} {NAME[dtype]}" + (f": {error}" if error else ""))
                failed += bool(error)
        print(f"not run (torch cannot): {NOT_ON_CPU}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"half_optim: {failed} case(s) failed")
        return 1
    print("half_optim: all cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
