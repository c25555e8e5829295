#!/usr/bin/env python3
# Data parallelism for the LM and the GANs, with the classifiers' guarantees: 2 CPU ranks
# (--ranks 2, gradients over TCP) at batch 8 train with the losses of one process at the
# global batch 16 (relative difference <= 1e-5 over 20 steps, replicas checked every 5), and
# their checkpoint resumes on one process, which then continues as an uninterrupted one.
#   parallel_tasks_test.py TRAINER
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "fixtures", "lm_corpus.txt")
COMMON = ["--device", "cpu", "--threads", "1", "--no-progress", "--metrics-every", "1"]
MODELS = {
    "char-lstm": ["--text", CORPUS, "--seq-len", "32", "--epochs", "10"],
    "gan": ["--synthetic", "--epochs", "1"],
    # SGD, not the GANs' Adam: Adam's first steps move each weight by about the learning rate
    # times the sign of its gradient, so a gradient within rounding of 0 (a few of the
    # generator's 627,200 first-layer weights) lands on either side by the order of the sums
    # alone and the losses part at 1e-4 from step 2 on some seeds, whichever way the
    # statistics are combined; with SGD a rounding difference stays one.
    "dcgan": ["--synthetic", "--epochs", "1", "--optimizer", "sgd"],
    # A classifier with batch norm and dropout (each rank drops its rows of the global mask);
    # SGD for the same reason as dcgan: under its default Adam, weights whose first gradient is
    # within rounding of 0 move by +-lr on the order of the sums alone (on an AVX2 processor,
    # where oneDNN sums in another order than with AVX-512, blocks.0.conv1's weights part by
    # 2e-3 after one step and the losses by 3e-5 at step 2).
    "resnet": ["--synthetic", "--epochs", "1", "--lr-schedule", "constant", "--optimizer", "sgd"],
}
# The ranks' own flags: dcgan's batch norms over the global batch (--sync-batch-norm), without
# which each rank would normalise its 8 rows alone and train another model (its losses then
# differ by 5e-3 at step 1 and 7e-2 at step 20).
RANK_FLAGS = {"dcgan": ["--sync-batch-norm"], "resnet": ["--sync-batch-norm"]}
# Steps on 2 ranks, then on one process from their checkpoint: dcgan's losses agree to 3e-7
# for 15 steps, then its adversarial steps amplify the reordered sums' rounding (4e-6 at step
# 16, 1e-5 at 17, 1e-4 at 19), so it stops at 12; resnet's (SGD at a constant rate) to 3e-7
# for 4 steps on an AVX2 processor, 4e-6 at step 6 (under Adam, without --sync-batch-norm, 3e-3
# at step 1; without each rank's rows of the dropout masks 2e-2).
STEPS = {"dcgan": (8, 12), "resnet": (3, 4)}
GAN_KEYS = ["loss", "d_loss", "g_loss", "d_accuracy"]
LOSS_KEYS = {"char-lstm": ["loss"], "gan": GAN_KEYS, "dcgan": GAN_KEYS, "resnet": ["loss"]}
TOLERANCE = 1e-5

failures = []


def train(trainer, model, name, extra, workdir):
    metrics = os.path.join(workdir, f"{model}-{name}.jsonl")
    args = [trainer, "--model", model, "--metrics", metrics] + COMMON + MODELS[model] + extra
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"{model} {name}: exit {done.returncode}: {done.stderr.strip()}")
    with open(metrics) as f:
        return [line for line in map(json.loads, f) if line["kind"] == "step"]


def compare(model, what, got, want):
    if [g["step"] for g in got] != [w["step"] for w in want]:
        failures.append(f"{model} {what}: steps {[g['step'] for g in got]}, expected "
                        f"{[w['step'] for w in want]}")
        return
    for g, w in zip(got, want):
        for key in LOSS_KEYS[model]:
            scale = max(abs(w[key]), 1e-12)
            if abs(g[key] - w[key]) / scale > TOLERANCE:
                failures.append(f"{model} {what}: step {g['step']} {key} {g[key]} but one "
                                f"process gives {w[key]}")


def main():
    trainer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as workdir:
        for model in MODELS:
            ckpt = os.path.join(workdir, model + ".safetensors")
            parallel, total = STEPS.get(model, (20, 30))
            one = train(trainer, model, "one", ["--batch-size", "16", "--max-steps", str(total)],
                        workdir)
            two = train(trainer, model, "two",
                        ["--batch-size", "8", "--ranks", "2", "--max-steps", str(parallel),
                         "--check-replicas", "5", "--checkpoint", ckpt] +
                        RANK_FLAGS.get(model, []), workdir)
            compare(model, "2 ranks", two, one[:parallel])
            resumed = train(trainer, model, "resumed",
                            ["--batch-size", "16", "--max-steps", str(total), "--resume", ckpt],
                            workdir)
            compare(model, "resumed on one process", resumed, one[parallel:])
            print(f"{model}: done")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
