#!/usr/bin/env python3
# Every task gets every loop feature: for a classifier (lenet), a GAN (gan) and the LM
# (char-lstm), --trace writes a Perfetto JSON trace (the GAN's with the kernels of both its
# programs) and --metrics-every 5 gives step lines every 5 steps and after the last, every
# line of every task in the one metrics schema. Also: every flag of --help (made from the
# one flag table) is in README.md's table.
#   loop_features_test.py TRAINER
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "fixtures", "lm_corpus.txt")
COMMON = ["--device", "cpu", "--threads", "1", "--no-progress", "--batch-size", "8",
          "--max-steps", "12"]
MODELS = {
    "lenet": ["--synthetic", "--epochs", "1"],
    "gan": ["--synthetic", "--epochs", "1"],
    "char-lstm": ["--text", CORPUS, "--seq-len", "32", "--epochs", "10"],
}

# The one schema: the keys every line of its kind has, and each task's extra values.
STEP_KEYS = {"kind", "step", "epoch", "loss", "lr", "examples_per_second", "data_wait_ms"}
EPOCH_KEYS = {"kind", "step", "epoch", "loss", "lr", "seconds", "examples_per_second",
              "data_wait_ms"}
STEP_EXTRAS = {"lenet": set(), "gan": {"d_loss", "g_loss", "d_accuracy"},
               "char-lstm": {"bits_per_char"}}
EPOCH_EXTRAS = {"lenet": {"test_accuracy", "test_loss"},
                "gan": {"d_loss", "g_loss", "d_accuracy", "samples"},
                "char-lstm": {"bits_per_char", "validation_bits_per_char"}}
INTEGERS = {"step", "epoch"}
STRINGS = {"kind", "samples"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def run(trainer, model, extra, workdir):
    done = subprocess.run([trainer, "--model", model] + COMMON + MODELS[model] + extra,
                          cwd=workdir, capture_output=True, text=True)
    check(done.returncode == 0, f"{model}: exit {done.returncode}: {done.stderr.strip()}")


def check_line(model, line):
    kind = line.get("kind")
    keys = STEP_KEYS if kind == "step" else EPOCH_KEYS
    extras = (STEP_EXTRAS if kind == "step" else EPOCH_EXTRAS)[model]
    check(kind in ("step", "epoch"), f"{model}: a line of kind {kind!r}")
    check(set(line) == keys | extras, f"{model}: {kind} line keys {sorted(line)}, expected "
                                      f"{sorted(keys | extras)}")
    for key, value in line.items():
        if key in STRINGS:
            check(isinstance(value, str), f"{model}: {key} is {value!r}, not a string")
        elif key in INTEGERS:
            check(isinstance(value, int) and value >= 1, f"{model}: {key} is {value!r}")
        else:
            check(value is None or isinstance(value, (int, float)), f"{model}: {key} is {value!r}")


def check_metrics(trainer, model, workdir):
    path = os.path.join(workdir, model + ".jsonl")
    run(trainer, model, ["--metrics", path, "--metrics-every", "5"], workdir)
    with open(path) as f:
        lines = [json.loads(text) for text in f]
    for line in lines:
        check_line(model, line)
    steps = [line["step"] for line in lines if line.get("kind") == "step"]
    check(steps == [5, 10, 12], f"{model}: step lines at {steps}, expected [5, 10, 12]")


def check_trace(trainer, model, workdir):
    path = os.path.join(workdir, model + ".trace.json")
    run(trainer, model, ["--trace", path], workdir)
    with open(path) as f:
        trace = json.load(f)  # Perfetto's JSON format: {"traceEvents": [...]}
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("ph") == "X"]
    for e in kernels:
        check(isinstance(e.get("name"), str) and isinstance(e.get("pid"), int) and
              isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))
              and e["dur"] >= 0, f"{model}: a malformed complete event {e}")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    with_kernels = {names.get(e["pid"]) for e in kernels}
    check(len(kernels) > 0, f"{model}: no kernels in the trace")
    if model == "gan":  # both programs, one process each
        want = {"discriminator step", "generator step"}
        check(with_kernels == want, f"{model}: kernels of {with_kernels}, expected {want}")
    else:
        check(len(with_kernels) == 1, f"{model}: kernels of {with_kernels}, expected one step")
    check(not [p for p in os.listdir(workdir) if ".part" in p], f"{model}: trace parts left")


def check_help_in_readme(trainer):
    done = subprocess.run([trainer, "--help"], capture_output=True, text=True)
    check(done.returncode == 0, f"--help exited {done.returncode}")
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)", done.stdout, re.M)) - {"--help"}
    check(len(flags) > 40, f"--help lists only {sorted(flags)}")
    with open(os.path.join(HERE, "..", "README.md")) as f:
        readme = f.read()
    missing = sorted(f for f in flags if f"`{f}" not in readme)
    check(not missing, f"README.md does not document {missing}")


def main():
    trainer = os.path.abspath(sys.argv[1])
    check_help_in_readme(trainer)
    with tempfile.TemporaryDirectory() as workdir:
        for model in MODELS:
            check_metrics(trainer, model, workdir)
            check_trace(trainer, model, workdir)
            print(f"{model}: done")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
