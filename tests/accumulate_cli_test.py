#!/usr/bin/env python3
# trainer --accumulate N: a step of N micro-batches of B trains as one step of N B examples.
# lenet (SGD, constant rate) at --batch-size 8 --accumulate 2 gives the losses of
# --batch-size 16 to 1e-5 for 12 steps, as 2 CPU ranks at 4 x 2 do; a checkpoint of the
# batch-16 run resumes at 8 x 2 and continues as the uninterrupted run; char-lstm trains with
# it. Refused, each with a clear error: a resume whose steps hold other examples, a GAN, 0, and
# more micro-batches than an epoch has.
#   accumulate_cli_test.py TRAINER
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "fixtures", "lm_corpus.txt")
COMMON = ["--device", "cpu", "--threads", "1", "--no-progress", "--metrics-every", "1"]
LENET = ["--model", "lenet", "--synthetic", "--epochs", "1", "--optimizer", "sgd",
         "--lr-schedule", "constant"]
TOLERANCE = 1e-5

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def run(trainer, args, workdir):
    return subprocess.run([trainer] + COMMON + args, cwd=workdir, capture_output=True,
                          text=True, timeout=300)


def steps(trainer, args, workdir, name):
    metrics = os.path.join(workdir, name + ".jsonl")
    done = run(trainer, args + ["--metrics", metrics], workdir)
    check(done.returncode == 0, f"{name}: exit {done.returncode}: {done.stderr.strip()}")
    if done.returncode != 0:
        return []
    with open(metrics) as f:
        return [line for line in map(json.loads, f) if line["kind"] == "step"]


def compare(what, got, want):
    check([g["step"] for g in got] == [w["step"] for w in want],
          f"{what}: steps {[g['step'] for g in got]}, expected {[w['step'] for w in want]}")
    for g, w in zip(got, want):
        check(abs(g["loss"] - w["loss"]) <= TOLERANCE * abs(w["loss"]),
              f"{what}: step {g['step']} loss {g['loss']} but one batch gives {w['loss']}")


def refused(trainer, args, workdir, code, text, what):
    done = run(trainer, args, workdir)
    check(done.returncode == code and text in done.stderr,
          f"{what}: exit {done.returncode} (expected {code}), stderr {done.stderr.strip()!r} "
          f"without {text!r}")


def main():
    trainer = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as workdir:
        ckpt = os.path.join(workdir, "half.safetensors")
        whole = steps(trainer, LENET + ["--batch-size", "16", "--max-steps", "12"], workdir,
                      "whole")
        parts = steps(trainer, LENET + ["--batch-size", "8", "--accumulate", "2",
                                        "--max-steps", "12"], workdir, "parts")
        compare("8 x 2 against 16", parts, whole)
        ranks = steps(trainer, LENET + ["--batch-size", "4", "--accumulate", "2", "--ranks", "2",
                                        "--check-replicas", "4", "--max-steps", "12"], workdir,
                      "ranks")
        compare("4 x 2 ranks x 2 against 16", ranks, whole)
        # Six steps at 16, then six at 8 x 2 from their checkpoint.
        steps(trainer, LENET + ["--batch-size", "16", "--max-steps", "6", "--checkpoint",
                                ckpt], workdir, "first")
        resumed = steps(trainer, LENET + ["--batch-size", "8", "--accumulate", "2",
                                          "--max-steps", "12", "--resume", ckpt], workdir,
                        "resumed")
        compare("resumed at 8 x 2", resumed, whole[6:])
        lm = steps(trainer, ["--model", "char-lstm", "--text", CORPUS, "--seq-len", "32",
                             "--batch-size", "4", "--accumulate", "3", "--epochs", "10",
                             "--max-steps", "20"],
                   workdir, "lm")
        check(len(lm) == 20 and lm[-1]["loss"] < lm[0]["loss"],
              f"char-lstm at 4 x 3: {len(lm)} steps, loss {lm[0]['loss'] if lm else None} -> "
              f"{lm[-1]['loss'] if lm else None}")
        refused(trainer, LENET + ["--batch-size", "8", "--max-steps", "12", "--resume", ckpt],
                workdir, 1, "written with batch size 16 but this run has 8", "another batch")
        refused(trainer, LENET + ["--batch-size", "4", "--accumulate", "2", "--max-steps", "12",
                                  "--resume", ckpt], workdir, 1,
                "steps of 16 examples (batch 16 x 1 ranks x --accumulate 1) but this run has 8 "
                "(batch 4 x 1 ranks x --accumulate 2)", "another step's examples")
        refused(trainer, ["--model", "gan", "--synthetic", "--accumulate", "2"], workdir, 2,
                "--accumulate does not apply to model gan", "a GAN")
        refused(trainer, LENET + ["--accumulate", "0"], workdir, 2, "--accumulate", "0")
        refused(trainer, LENET + ["--batch-size", "512", "--accumulate", "1000"], workdir, 1,
                "--accumulate 1000: an epoch has only", "more micro-batches than an epoch")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    if not failures:
        print("accumulate: done")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
