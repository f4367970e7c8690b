#!/usr/bin/env python3
"""Crash-safety of popart-run's checkpoints (issue 23, item 2).

Trains an MLP with Dropout and Adam on a slice of Fashion-MNIST with `--checkpoint DIR
--checkpoint-every 1`, kills it with SIGKILL at random moments (resuming from DIR each time), and
checks after every kill that the folder resumes. The checkpoint (~22 MB: weights and Adam's two
moments) takes long enough to write that some kills land during the write, which shows as a
temporary file left behind; the test requires some. Finally it resumes to the end and requires the
last checkpoint and the saved model to be bit-identical to those of an uninterrupted run, and a
truncated or bit-flipped copy of it to be refused with a message that says so.

Usage: checkpoint_kill.py POPART_RUN [--kills N] [--seed S]
"""
import argparse
import gzip
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FASHION = "/usr/share/datasets/fashion-mnist"
SAMPLES = 4096
BATCH = 16
HIDDEN = 1024


def write_model(path):
    rng = np.random.default_rng(3)

    def init(shape, name):
        bound = 1.0 / np.sqrt(shape[0])
        return numpy_helper.from_array(rng.uniform(-bound, bound, shape).astype(np.float32), name)

    inits = [init((784, HIDDEN), "w1"), init((HIDDEN,), "b1"), init((HIDDEN, HIDDEN), "w2"),
             init((HIDDEN,), "b2"), init((HIDDEN, 10), "w3"),
             numpy_helper.from_array(np.array(0.25, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "training")]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        # Dropout: a resumed run must also continue the random stream where it stopped.
        helper.make_node("Dropout", ["r1", "ratio", "training"], ["d1"]),
        helper.make_node("Gemm", ["d1", "w2", "b2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["logits"]),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean"),
    ]
    graph = helper.make_graph(
        nodes, "kill_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, 784]),
         helper.make_tensor_value_info("y", TensorProto.INT64, [BATCH])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def write_data(folder):
    """The first SAMPLES Fashion-MNIST training images (random ones if the dataset is absent)."""
    images_gz = os.path.join(FASHION, "train-images-idx3-ubyte.gz")
    if os.path.exists(images_gz):
        with gzip.open(images_gz) as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16)[:SAMPLES * 784]
        with gzip.open(os.path.join(FASHION, "train-labels-idx1-ubyte.gz")) as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)[:SAMPLES]
        x = x.reshape(SAMPLES, 784).astype(np.float32) / 255.0
    else:
        rng = np.random.default_rng(5)
        x = rng.random((SAMPLES, 784), np.float32)
        y = rng.integers(0, 10, SAMPLES)
    np.save(os.path.join(folder, "x.npy"), x)
    np.save(os.path.join(folder, "y.npy"), y.astype(np.int64))


def progress_step(folder):
    try:
        with open(os.path.join(folder, "progress.txt")) as f:
            return int(dict(line.split() for line in f)["step"])
    except FileNotFoundError:
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("popart_run")
    ap.add_argument("--kills", type=int, default=24)
    ap.add_argument("--steps", type=int, default=0, help="steps of the run (default: enough for the kills)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random kill times (default: random)")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"checkpoint_kill: seed {seed} (rerun with --seed {seed})", flush=True)
    rng = random.Random(seed)

    tmp = tempfile.mkdtemp(prefix="popart_ckpt_kill_")
    try:
        model = os.path.join(tmp, "model.onnx")
        write_model(model)
        write_data(tmp)
        # Fixed MatMul ways and threads: an uninterrupted run and a resumed one then compute alike
        # (a fresh run would otherwise time its own ways; a resumed one takes the recorded ones).
        base = [args.popart_run, model, "--train", "--input", "x=" + os.path.join(tmp, "x.npy"),
                "--input", "y=" + os.path.join(tmp, "y.npy"), "--optimizer", "adam", "--lr", "0.001",
                "--shuffle", "--seed", "11", "--matmul-tuning", "0", "--threads", "1"]

        def run(extra, **kw):
            return subprocess.run(base + extra, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

        # The time to start (import, compile) and one step with its checkpoint, to aim the kills.
        probe = os.path.join(tmp, "probe")
        t0 = time.monotonic()
        r = run(["--steps", "1", "--checkpoint", probe])
        startup = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit(f"FAILED: a one-step run failed:\n{r.stdout}")
        t0 = time.monotonic()
        r = run(["--steps", "11", "--checkpoint", probe, "--checkpoint-every", "1"])
        per_step = max((time.monotonic() - t0 - startup) / 10, 1e-3)
        if r.returncode != 0:
            sys.exit(f"FAILED: a checkpointing run failed:\n{r.stdout}")
        size = os.path.getsize(os.path.join(probe, "checkpoint-11.ckpt"))
        print(f"start-up {startup:.2f} s, a step with its checkpoint {per_step * 1000:.0f} ms, "
              f"checkpoint {size / 1e6:.1f} MB", flush=True)
        # Each killed run lives up to a few steps past start-up on average: enough steps that the kills
        # end before the run does.
        steps = args.steps or max(40, int(args.kills * 4))
        reference = os.path.join(tmp, "reference")
        r = run(["--steps", str(steps), "--checkpoint", reference, "--checkpoint-every", "1",
                 "--save", os.path.join(tmp, "reference.onnx")])
        if r.returncode != 0:
            sys.exit(f"FAILED: the uninterrupted run failed:\n{r.stdout}")

        folder = os.path.join(tmp, "ckpt")
        check = os.path.join(tmp, "check")
        final = f"checkpoint-{steps}.ckpt"
        with open(os.path.join(reference, final), "rb") as f:
            want = f.read()

        def final_checkpoint(what):
            """The final checkpoint in folder, which must be the uninterrupted run's, byte for byte."""
            with open(os.path.join(folder, final), "rb") as f:
                got = f.read()
            if got != want:
                diff = next(i for i in range(min(len(got), len(want))) if got[i] != want[i]) \
                    if len(got) == len(want) else "sizes differ"
                sys.exit(f"FAILED: the final checkpoint of {what} differs from the uninterrupted run's "
                         f"(first at byte {diff})")
            return got

        kills = during_write = resumes_checked = finished_early = 0
        while kills < args.kills:
            resume = ["--resume", folder] if progress_step(folder) is not None else []
            before = progress_step(folder)
            launched = time.time()
            p = subprocess.Popen(base + ["--steps", str(steps), "--checkpoint", folder, "--checkpoint-every", "1"]
                                 + resume, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            delay = rng.uniform(startup * 0.8, startup + 4 * per_step)
            time.sleep(delay)
            if p.poll() is not None:
                out = p.communicate()[0]
                if p.returncode != 0:
                    sys.exit(f"FAILED: a run resumed from step {before} failed:\n{out}")
                # The machine ran faster than the probe measured: the run ended before its kill. It
                # must still end as the uninterrupted run did; the kills go on from a new folder.
                finished_early += 1
                if finished_early > args.kills:
                    sys.exit(f"FAILED: {finished_early} runs reached step {steps} before their kill; "
                             "give more --steps")
                final_checkpoint(f"a run that reached step {steps} after {kills} kills")
                print(f"run finished before kill {kills + 1}: bit-identical; starting again", flush=True)
                shutil.rmtree(folder)
                continue
            p.send_signal(signal.SIGKILL)
            p.communicate()
            kills += 1
            # A temporary file this run wrote (not one an earlier kill left, which the next save
            # removes): the kill landed during a write.
            left = sorted(n for n in os.listdir(folder) if n.endswith(".tmp")
                          and os.stat(os.path.join(folder, n)).st_mtime >= launched - 0.05) \
                if os.path.isdir(folder) else []
            during_write += bool(left)
            step = progress_step(folder)
            print(f"kill {kills}: after {delay:.2f} s, progress step {before} -> {step}"
                  + (f", left {', '.join(left)}" if left else ""), flush=True)
            if step is None:
                continue
            # The folder must resume: one more step, on a copy (the killed folder goes on as it is).
            shutil.rmtree(check, ignore_errors=True)
            shutil.copytree(folder, check)
            r = run(["--steps", str(step + 1), "--resume", check])
            if r.returncode != 0 or f"resuming at step {step}" not in r.stdout:
                sys.exit(f"FAILED: the folder left by kill {kills} (progress step {step}) does not resume:\n{r.stdout}")
            resumes_checked += 1

        resume = ["--resume", folder] if progress_step(folder) is not None else []
        r = run(["--steps", str(steps), "--checkpoint", folder, "--checkpoint-every", "1",
                 "--save", os.path.join(tmp, "resumed.onnx")] + resume)
        if r.returncode != 0:
            sys.exit(f"FAILED: the final resume failed:\n{r.stdout}")
        got = final_checkpoint("the resumed run")
        with open(os.path.join(tmp, "reference.onnx"), "rb") as f:
            want_model = f.read()
        with open(os.path.join(tmp, "resumed.onnx"), "rb") as f:
            got_model = f.read()
        leftovers = sorted(n for n in os.listdir(folder) if n not in (final, "progress.txt"))
        print(f"{kills} kills, {during_write} during a checkpoint write (a temporary file left behind), "
              f"{resumes_checked} folders resumed, {finished_early} run(s) finished before their kill; "
              f"final checkpoint {len(got)} bytes", flush=True)
        if got_model != want_model:
            sys.exit("FAILED: the saved model differs from the uninterrupted run's")
        if leftovers:
            sys.exit(f"FAILED: the folder keeps stale files: {leftovers}")
        if during_write == 0:
            sys.exit("FAILED: no kill landed during a checkpoint write (the test did not test that)")
        # A damaged folder is refused with a clear error, never resumed from half a checkpoint.
        for damage, expected in (("truncate", f"truncated at byte {len(got) // 2} of {len(got)}"),
                                 ("flip", "checksum mismatch")):
            shutil.rmtree(check, ignore_errors=True)
            shutil.copytree(folder, check)
            bad = bytearray(got[:len(got) // 2]) if damage == "truncate" else bytearray(got)
            if damage == "flip":
                bad[len(bad) // 2] ^= 0x10
            with open(os.path.join(check, final), "wb") as f:
                f.write(bad)
            r = run(["--steps", str(steps + 1), "--resume", check])
            if r.returncode == 0 or expected not in r.stdout or final not in r.stdout:
                sys.exit(f"FAILED: a folder whose checkpoint was damaged ({damage}) was not refused with "
                         f"'{expected}':\n{r.stdout}")
            print(f"damaged ({damage}): {r.stdout.strip().splitlines()[-1]}", flush=True)
        print("checkpoint_kill: PASSED (bit-identical to the uninterrupted run)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
