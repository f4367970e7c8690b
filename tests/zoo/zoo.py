#!/usr/bin/python3
"""Model-zoo parity test of popart-run against PyTorch: real architectures from torchvision and
torch.nn (tests/zoo/models.py), built at test time with random weights at small sizes.

For every model, in a temporary directory:
  1. inference: the network is exported in eval mode (logits); `popart-run --save-outputs` on
     one batch is compared with torch's logits;
  2. training, once with SGD (momentum, dampening, weight decay) and once with AdamW: the network
     with its loss is exported in training mode (as tests/parity/parity.py does: loss inside the
     graph, no constant folding, parameters as initializers), trained STEPS steps by
     `popart-run --train ... --save out.onnx`, and every float state_dict entry (weights and
     BatchNorm running statistics) of out.onnx is compared with torch's;
  3. every float state_dict entry must have changed in our trained model, by more than weight
     decay alone would move it (a weight whose gradient is lost moves only by its decay).

The tolerance is PyTorch's own rounding error: torch trains a float64 copy from the same weights
and data, and for each tensor (and for the logits)
    max |ours - torch32| <= FACTOR * max |torch32 - torch64| + ATOL + RTOL * max |torch64|.
A fixed tolerance would be meaningless here: in chaotic models (BatchNorm over a few values per
channel, as in MobileNet on 1x1 maps) float32 rounding alone moves the weights by far more than
in a perceptron.

Adam-family optimisers divide by the gradient's own size, so an element whose gradient is within
float32's rounding of zero moves by about lr in a direction that rounding chooses. Such elements
are found from torch alone: at some step, |gradient in float64| <= FACTOR x the largest
difference between torch's float32 gradients and its float64 ones for that tensor. They are held
to the tensor's bound plus twice the tensor's movement (any direction, not any size), counted in
the summary line; every other element keeps the tensor's bound, measured with perturbed torch
runs that add another float32 rounding error to the first gradients (a sign flipped changes every
later step).

Models that cannot pass yet because a feature is missing are listed in KNOWN_FAILING with the
error they must fail with. They print loudly; one that fails otherwise, or passes, is a failure
(so the list cannot hide a regression and is pruned when the feature lands).

Usage: zoo.py --popart-run PATH [--filter SUBSTR] [--keep DIR] [--verbose] [--steps N]
              [--extra-train-flags FLAGS]
Exits nonzero on any failure; each failure names the model, the check, the tensor and the error.
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree from the imports below
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "parity"))
import models  # noqa: E402
import parity  # noqa: E402  (export, optimiser and command-line helpers shared with parity.py)

STEPS = 3
FACTOR = 10.0  # how many times torch32-vs-torch64's error ours may be off torch32
ATOL, RTOL = 1e-6, 1e-5  # the floor, for tensors where torch32 and torch64 happen to agree
PERTURBED_RUNS = 2  # extra float32 runs from nudged weights and data (see check_training)

OPTIMISERS = [
    parity.case("zoo", "sgd", "momentum", lr=0.01, momentum=0.9, dampening=0.1, weight_decay=0.01),
    parity.case("zoo", "adamw", lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05),
]

# (model, check) -> (the error it must fail with, why). Each entry prints loudly at every run.
# Remove an entry when its feature lands: a listed check that passes fails the test.
KNOWN_FAILING = {}


class Failure(Exception):
    pass


def run_popart(args, command):
    if args.verbose:
        print("  $ " + " ".join(command), flush=True)
    started = time.time()
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if args.verbose:
        print(f"    ({time.time() - started:.1f} s)")
    if result.returncode != 0:
        lines = [l for l in (result.stdout + result.stderr).splitlines() if l.strip()]
        raise Failure(f"popart-run exited with {result.returncode}: "
                      f"{' / '.join(lines[-3:]) if lines else 'no output'}\n    command: "
                      f"{' '.join(command)}")
    return result.stdout


def cli_arguments(c):
    """popart-run's training flags for optimiser case \\p c (hyperparameters as flags)."""
    flags = ["--train", "--verify-ir", "--optimizer", c.opt, "--steps", str(STEPS)]
    for key, value in c.hyper.items():
        flags += [f"--{key.replace('_', '-')}", repr(value)]
    return flags


def bound(t32, t64):
    """The tolerance of one tensor: FACTOR x torch's own float32 error plus the floor."""
    return FACTOR * float(np.max(np.abs(t32 - t64), initial=0.0)) + ATOL + RTOL * float(
        np.max(np.abs(t64), initial=0.0))


def set_state(module, state):
    with torch.no_grad():
        sd = module.state_dict()
        for k, v in state.items():
            sd[k].copy_(v.to(sd[k].dtype))


def check_inference(name, args, net, state0, data, workdir):
    """Eval-mode logits of one batch: ours vs torch32, bounded by torch32 vs torch64."""
    spec = models.ZOO[name]
    inputs = [k for k in data if k != "target"]
    batch = {k: data[k][:spec.batch] for k in inputs}
    net32 = copy.deepcopy(net)
    set_state(net32, state0)
    net32.eval()
    net64 = copy.deepcopy(net32).double()
    t32_in = [torch.from_numpy(batch[k]) for k in inputs]
    t64_in = [t.double() if t.is_floating_point() else t for t in t32_in]
    path = os.path.join(workdir, "infer.onnx")
    # Not under no_grad: there nn.MultiheadAttention takes a fused path that cannot be exported.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net32, tuple(t32_in), path, training=torch.onnx.TrainingMode.EVAL,
                          opset_version=parity.OPSET, input_names=inputs, output_names=["logits"])
    with torch.no_grad():
        want32 = net32(*t32_in).numpy().astype(np.float64)
        want64 = net64(*t64_in).numpy()
    command = [args.popart_run, path, "--verify-ir", "--save-outputs", os.path.join(workdir, "outputs")]
    for k in inputs:
        file = os.path.join(workdir, f"infer_{k}.npy")
        np.save(file, batch[k])
        command += ["--input", f"{k}={file}"]
    run_popart(args, command)
    got = np.load(os.path.join(workdir, "outputs", "logits.npy")).astype(np.float64)
    if got.shape != want32.shape:
        raise Failure(f"logits: shape {got.shape}, torch {want32.shape}")
    if not np.any(want32):
        raise Failure("torch's logits are all zero, so the comparison would be vacuous")
    err = float(np.max(np.abs(got - want32)))
    b = bound(want32, want64)
    ref = float(np.max(np.abs(want32 - want64)))
    line = (f"logits max abs err {err:.3g} vs torch32 (torch32 vs torch64 {ref:.3g}; "
            f"bound {b:.3g}; |logits| up to {np.max(np.abs(want64)):.3g})")
    if not err <= b:
        raise Failure(line)
    return line


def decay_only(c, initial):
    """Where \\p initial goes in STEPS steps of case \\p c if its gradient is always zero."""
    p = torch.nn.Parameter(initial.clone().double())
    opt = parity.torch_optimizer(c, [p])
    for _ in range(STEPS):
        p.grad = torch.zeros_like(p)
        opt.step()
    return p.detach().numpy()


def perturbed(wrapper, data, seed):
    """A copy of \\p wrapper and \\p data with every float value multiplied by 1 + u * 2^-24,
    u uniform in [-1, 1]: a float32 rounding's worth of difference."""
    rng = np.random.default_rng(seed)

    def nudge(a):
        return (a.astype(np.float64) * (1 + rng.uniform(-1, 1, a.shape) * 2.0 ** -24)).astype(a.dtype)

    copy_ = copy.deepcopy(wrapper)
    with torch.no_grad():
        for v in copy_.state_dict().values():
            if v.dtype.is_floating_point:
                v.copy_(torch.from_numpy(nudge(v.numpy())))
    return copy_, {k: nudge(a) if a.dtype.kind == "f" else a for k, a in data.items()}


def train_torch(c, wrapper, data, dtype, first_error=None, rng=None, first_grads=False):
    """STEPS updates of case \\p c on \\p data (batch by batch, in order) in \\p dtype; returns the
    float state as float64 numpy arrays, the losses and, with \\p first_grads, the first step's
    gradients (name -> array; else empty). \\p first_error (name -> array), its elements shuffled
    by \\p rng, is added to the first gradients; the gradients returned are those before it."""
    batch = wrapper.batch
    wrapper = wrapper.to(dtype)
    params = [p for p in wrapper.parameters() if p.requires_grad]
    opt = parity.torch_optimizer(c, params)
    tensors = [torch.from_numpy(a) for a in data.values()]
    tensors = [t.to(dtype) if t.is_floating_point() else t for t in tensors]
    losses = []
    grads = {}
    for step in range(STEPS):
        opt.zero_grad()
        loss = wrapper(*[t[step * batch:(step + 1) * batch] for t in tensors])
        losses.append(loss.item())
        loss.backward()
        if step == 0:
            for k, p in wrapper.net.named_parameters():
                if not p.requires_grad:
                    continue
                if first_grads:
                    grads[k] = p.grad.detach().double().numpy().copy()
                if first_error is not None:
                    shuffled = rng.permutation(first_error[k].ravel()).reshape(p.shape)
                    p.grad += torch.from_numpy(shuffled).to(dtype)
        opt.step()
    state = {k: v.detach().double().numpy().copy() for k, v in wrapper.net.state_dict().items()
             if v.dtype.is_floating_point}
    return state, losses, grads


def sign_ambiguous(grads64, grads32):
    """Per parameter, the elements whose first gradient float32 cannot sign: |g64| <= FACTOR x
    max |g32 - g64| over the tensor. (Only the first: later gradients differ by the runs'
    divergence too, which the perturbed runs measure.)"""
    return {k: np.abs(g64) <= FACTOR * float(np.max(np.abs(grads32[k] - g64), initial=0.0))
            for k, g64 in grads64.items()}


def check_training(name, c, args, model_path, input_files, wrapper0, state0, data, extra, initial,
                   workdir):
    """Trains case \\p c in torch (float32 and float64) and with popart-run; returns a summary
    line; raises Failure naming the first bad tensor (after printing every bad one)."""
    w32 = copy.deepcopy(wrapper0)
    w64 = copy.deepcopy(wrapper0)
    adam = c.opt != "sgd"  # only optimisers that divide by the gradient's size need its sign
    want32, losses, grads32 = train_torch(c, w32, data, torch.float32, first_grads=adam)
    want64, _, grads64 = train_torch(c, w64, data, torch.float64, first_grads=adam)
    # torch's float32 error: its distance from float64, also in runs whose weights and data
    # were nudged by rounding-sized amounts (near a kink such as ReLU6 at 0, whether an
    # element's rounding flips the branch is luck; one run rarely shows it). For Adam-family
    # optimisers, which first gradients round to the other sign (and move a full step the other
    # way) is luck too, and it changes every later step: those runs add another float32
    # rounding error to the first gradients (torch's own, g32 - g64, shuffled over each tensor).
    # Only optimisers that divide by the gradient's size turn its rounding into a full step.
    ambiguous, first_error = {}, None
    if adam:
        ambiguous = sign_ambiguous(grads64, grads32)
        first_error = {k: grads32[k] - g64 for k, g64 in grads64.items()}
    noise32 = {k: np.abs(v - want64[k]) for k, v in want32.items()}
    for seed in range(PERTURBED_RUNS):
        nudged, nudged_data = perturbed(wrapper0, data, seed)
        other, _, _ = train_torch(c, nudged, nudged_data, torch.float32, first_error,
                                  np.random.default_rng(100 + seed))
        for k in noise32:
            noise32[k] = np.maximum(noise32[k], np.abs(other[k] - want64[k]))
    if args.verbose:
        print(f"    torch losses: {' '.join(f'{v:.5f}' for v in losses)}")

    out_path = os.path.join(workdir, f"out-{c.name}.onnx")
    command = ([args.popart_run, model_path] + cli_arguments(c) + args.extra_train_flags.split() +
               input_files + ["--save", out_path])
    run_popart(args, command)
    trained = parity.read_initializers(out_path)

    n_loose = 0
    problems, worst, noise, unobservable = [], (0.0, "", ""), [], []
    for k, t32 in want32.items():
        key = "net." + k
        if key not in trained:
            raise Failure(f"{out_path} has no initializer {key}")
        got = trained[key].astype(np.float64)
        t64 = want64[k]
        if got.shape != t32.shape:
            problems.append(f"{k}: shape {got.shape}, torch {t32.shape}")
            continue
        init = state0[k].double().numpy()
        # Every entry must move: running statistics at all, weights by more than their decay.
        if k in dict(wrapper0.net.named_parameters()):
            still = decay_only(c, state0[k])
            if np.allclose(t32, still, rtol=1e-6, atol=1e-12):
                # Its gradient is too small to move it visibly in float32 even in torch: only
                # a weight that is not updated at all can be told apart.
                unobservable.append(k)
                why = "not updated at all: not trained" if np.array_equal(got, init) else None
            else:
                why = ("not updated at all: not trained" if np.array_equal(got, init) else
                       "moved only by weight decay: no gradient reached it"
                       if np.allclose(got, still, rtol=1e-6, atol=1e-12) else None)
            if why:
                problems.append(f"weight {k} did not change ({why}); torch moved it by up to "
                                f"{np.max(np.abs(t32 - init)):.3g}")
                continue
        elif np.array_equal(got, init) and not np.array_equal(t32, init):
            problems.append(f"{k} did not change; torch moved it by up to "
                            f"{np.max(np.abs(t32 - init)):.3g}")
            continue
        diff = np.abs(got - t32)
        loose = ambiguous.get(k)
        ref = float(np.max(noise32[k] if loose is None else noise32[k][~loose], initial=0.0))
        b = FACTOR * ref + ATOL + RTOL * float(np.max(np.abs(t64), initial=0.0))
        moved = float(np.max(np.abs(t32 - init)))
        if loose is not None and loose.any():
            loose_err = float(np.max(diff[loose]))
            if not loose_err <= b + 2 * moved:
                problems.append(f"{k}: an element whose gradient float32 cannot sign is off by "
                                f"{loose_err:.3g}, more than its bound {b:.3g} + twice the tensor's "
                                f"movement {moved:.3g}")
            n_loose += int(loose.sum())
            diff = np.where(loose, 0.0, diff)
        err = float(np.max(diff, initial=0.0))
        detail = (f"max abs err {err:.3g} vs torch32 (torch32 vs torch64 {ref:.3g}, bound {b:.3g}, "
                  f"trained by up to {moved:.3g})")
        if not err <= b:
            problems.append(f"{k}: {detail}")
        elif args.verbose:
            print(f"    ok {k}: {detail}")
        noise.append(ref / max(float(np.max(np.abs(t32 - init))), 1e-30))
        if err / b >= worst[0]:
            worst = (err / b, k, detail)
    for k in extra:  # initializers that are not state must come back unchanged
        if k in trained and not np.array_equal(trained[k], initial[k]):
            problems.append(f"{k} (not a parameter) changed")
    if problems:
        # A weight that did not train is the likely cause of the other differences: name it first.
        problems.sort(key=lambda p: "did not change" not in p)
        for p in problems[1:]:
            print(f"    also: {p}")
        raise Failure(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    # How sharp the check is: torch's own float32 error as a share of how far training moved
    # each tensor (near 1: rounding decides the result, and only gross errors can show).
    tiny = (f"; {len(unobservable)} whose gradient moves them less than float32 resolves in torch "
            f"too, checked only for being updated ({', '.join(unobservable)})" if unobservable else "")
    signless = (f"; {n_loose} of {sum(m.size for m in ambiguous.values())} elements with a gradient "
                f"float32 cannot sign, held to twice their tensor's movement" if n_loose else "")
    return (f"{len(want32)} tensors, torch32-vs-64 a median {100 * np.median(noise):.2g}% of the "
            f"movement; worst {worst[1]} at {worst[0]:.2f} of its bound: {worst[2]}{tiny}{signless}")


def run_model(name, args, workdir):
    """Returns a list of (check, ok, message); raises nothing but KeyboardInterrupt."""
    spec = models.ZOO[name]
    net = models.build(name)
    wrapper = models.WithLoss(net)
    wrapper.train()
    wrapper.batch = spec.batch
    rng = np.random.default_rng(4321)
    data = models.dataset(name, rng, STEPS * spec.batch)
    inputs = list(data.keys())
    example = [torch.from_numpy(a[:spec.batch]) for a in data.values()]

    results = []
    model_path = os.path.join(workdir, "train.onnx")
    try:
        parity.export(wrapper, example, inputs, model_path)
    except Exception as e:  # noqa: BLE001 - any exporter error is this model's failure
        return [("export", False, f"torch.onnx.export failed: {e}")]
    initial = parity.read_initializers(model_path)
    state = parity.float_state(net)
    missing = [k for k in state if "net." + k not in initial]
    if missing:
        return [("export", False, f"state_dict entries without an initializer: {missing}")]
    # Tracing ran one training-mode forward pass, which moved BatchNorm's running statistics:
    # start torch from exactly the exported values.
    state0 = {k: torch.from_numpy(initial["net." + k].copy()) for k in state}
    set_state(net, state0)
    extra = sorted(k for k in initial if k[4:] not in state)
    if args.verbose:
        print(f"  ops: {parity.op_summary(model_path)}")

    input_files = []
    for k, a in data.items():
        path = os.path.join(workdir, f"{k}.npy")
        np.save(path, a)
        input_files += ["--input", f"{k}={path}"]

    checks = [("inference", lambda: check_inference(name, args, net, state0, data, workdir))]
    for c in OPTIMISERS:
        label = c.name[len("zoo-"):]
        if spec.optimisers is not None and label not in spec.optimisers:
            print(f"  {name}: {label} not checked for this model (see its entry in models.py)")
            continue
        checks.append((label, lambda c=c: check_training(
            name, c, args, model_path, input_files, wrapper, state0, data, extra, initial, workdir)))
    for label, check in checks:
        try:
            results.append((label, True, check()))
        except (Failure, subprocess.TimeoutExpired) as e:
            results.append((label, False, str(e)))
        except Exception as e:  # noqa: BLE001 - a harness or exporter error fails this check only
            results.append((label, False, f"{type(e).__name__}: {e}"))
    return results


def main():
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--popart-run", default="build/popart-run", help="popart-run binary")
    parser.add_argument("--filter", default="", help="run only models whose name contains this")
    parser.add_argument("--keep", help="keep each model's artefacts in DIR/<model>")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps (default %(default)s)")
    parser.add_argument("--extra-train-flags", default="",
                        help="more popart-run flags for the trainings, to test this script itself "
                             "(the zoo_catches_frozen_weight test passes --freeze)")
    args = parser.parse_args()
    STEPS = args.steps
    torch.set_num_threads(1)

    names = [n for n in models.ZOO if args.filter in n]
    if not names:
        sys.exit(f"zoo: no model matches '{args.filter}' ({', '.join(models.ZOO)})")
    if not os.access(args.popart_run, os.X_OK):
        sys.exit(f"zoo: popart-run '{args.popart_run}' is not executable")
    known = {k: v for k, v in KNOWN_FAILING.items() if k[0] in names}
    if known:
        print("KNOWN FAILING (tests/zoo/zoo.py KNOWN_FAILING; must fail with exactly this error):")
        for (model, check), (error, why) in known.items():
            print(f"  !! {model} {check}: '{error}' - {why}")

    failures, known_seen, checks = [], [], 0
    started = time.time()
    for name in names:
        print(f"{name} ({models.ZOO[name].note}):", flush=True)
        if args.keep:
            workdir = os.path.join(args.keep, name)
            shutil.rmtree(workdir, ignore_errors=True)
            os.makedirs(workdir)
        else:
            workdir = tempfile.mkdtemp(prefix=f"zoo-{name}-")
        t0 = time.time()
        try:
            results = run_model(name, args, workdir)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        checks += len(results)
        for check, ok, message in results:
            expected = KNOWN_FAILING.get((name, check))
            if expected and not ok and expected[0] in message:
                known_seen.append(f"{name} {check}")
                print(f"  KNOWN FAILING {check}: {message.splitlines()[0]}")
            elif expected and ok:
                failures.append(f"{name} {check}")
                print(f"  FAIL {name} {check}: passes but is listed in KNOWN_FAILING; remove it "
                      f"({message})")
            elif expected:
                failures.append(f"{name} {check}")
                print(f"  FAIL {name} {check}: {message}\n    (listed in KNOWN_FAILING, but with "
                      f"the error '{expected[0]}')")
            elif ok:
                print(f"  ok {check}: {message}")
            else:
                failures.append(f"{name} {check}")
                print(f"  FAIL {name} {check}: {message}")
        print(f"  ({time.time() - t0:.1f} s)", flush=True)
    print(f"zoo: {checks - len(failures) - len(known_seen)}/{checks} checks passed in "
          f"{time.time() - started:.1f} s ({STEPS} steps; bound = {FACTOR:g} x |torch32 - torch64| "
          f"+ {ATOL:g} + {RTOL:g} x |torch64|)")
    if known_seen:
        print(f"KNOWN FAILING ({len(known_seen)}, not counted as failures): {', '.join(known_seen)}")
    if failures:
        print("FAILED: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
