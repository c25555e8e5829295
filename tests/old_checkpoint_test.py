#!/usr/bin/env python3
# Checkpoints written before the training loops became one still resume: for a classifier,
# a GAN and the LM, 5 steps are trained and saved, the checkpoint's __metadata__ is replaced
# by the one the old build wrote (tests/fixtures/old_checkpoints.json: the old classifier
# format had kiln.config, the old GAN and LM formats had loose keys instead), and the run
# resumed to step 10 must give bitwise the recorded losses for steps 6..10 (the old build's,
# re-recorded with the old metadata kept when the CPU kernels changed their summation order:
# oneDNN convolutions and matmuls, issue 20; char-lstm again when the CPU's one-hot products
# became row gathers and scatters, one loss one unit in the last place, family 26, its family
# 25 recording dropped; lenet when its first layer moved to kiln's direct kernels, two losses
# one unit in the last place, family 26, its family 25 recording dropped; an AVX2 family 25
# model 1 added with --record-cpu from 485c9e4, its CPU kernels those of 1966d2b).
# (The tensors need no rewriting: their names and layout did not change, and the first
# steps are bitwise the old ones, see loss_fixture_test.py.)
#   old_checkpoint_test.py TRAINER            check
#   old_checkpoint_test.py TRAINER --record   record metadata and losses with this build
#   old_checkpoint_test.py TRAINER --record-cpu   add this CPU model's resumed losses (the old
#                                             metadata kept), as loss_fixture_test.py does
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "fixtures", "old_checkpoints.json")
CORPUS = os.path.join(HERE, "fixtures", "lm_corpus.txt")
sys.path.insert(0, HERE)
from loss_fixture_test import (cpu_identity, float_bits, recording_for_this_cpu,  # noqa: E402
                               vector_extensions)

COMMON = ["--batch-size", "8", "--threads", "1", "--device", "cpu", "--no-progress",
          "--metrics-every", "1", "--seed", "7"]
MODELS = {
    "lenet": ["--synthetic"],
    "gan": ["--synthetic"],
    "char-lstm": ["--text", CORPUS, "--seq-len", "32", "--hidden", "16", "--embedding", "8",
                  "--epochs", "10"],
}
LOSS_KEYS = {"gan": ["d_loss", "g_loss"]}


def read_header(path):
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        return header, f.read()


def replace_metadata(path, metadata):
    """Rewrites the safetensors header with `metadata` (the tensors' bytes stay as they are)."""
    header, data = read_header(path)
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def run(trainer, model, extra, workdir):
    args = [trainer, "--model", model] + COMMON + MODELS[model] + extra
    done = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{model}: {' '.join(args[1:])} exited {done.returncode}: "
                             f"{done.stderr.strip()}")


def resumed_losses(trainer, model, metadata, workdir):
    """Trains 5 steps, optionally swaps in `metadata`, resumes to 10: ({key: bits}, metadata)."""
    ckpt = os.path.join(workdir, model + ".safetensors")
    metrics = os.path.join(workdir, model + ".jsonl")
    run(trainer, model, ["--max-steps", "5", "--checkpoint", ckpt], workdir)
    written = read_header(ckpt)[0]["__metadata__"]
    if metadata is not None:
        replace_metadata(ckpt, metadata)
    run(trainer, model, ["--max-steps", "10", "--resume", ckpt, "--metrics", metrics], workdir)
    with open(metrics) as f:
        steps = [line for line in map(json.loads, f) if line["kind"] in ("step", "train")]
    if [line["step"] for line in steps] != list(range(6, 11)):
        raise AssertionError(f"{model}: resumed step lines {[s['step'] for s in steps]}")
    losses = {key: [float_bits(line[key]) for line in steps]
              for key in LOSS_KEYS.get(model, ["loss"])}
    return losses, written


def main():
    trainer, record = os.path.abspath(sys.argv[1]), "--record" in sys.argv[2:]
    record_cpu = "--record-cpu" in sys.argv[2:]
    fixture = {}
    if not record:
        with open(FIXTURE) as f:
            fixture = json.load(f)
    own = recording_for_this_cpu(fixture)
    if not record and not record_cpu and own is None and fixture["cpu"] != vector_extensions():
        print(f"skipped: recorded on a CPU with '{fixture['cpu']}', this one is '{cpu_identity()}'")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        for model in MODELS:
            if record:
                losses, metadata = resumed_losses(trainer, model, None, workdir)
                fixture[model] = {"metadata": metadata, **losses}
                continue
            want = fixture[model]
            losses, _ = resumed_losses(trainer, model, want["metadata"], workdir)
            if record_cpu:
                fixture.setdefault("by_cpu", {}).setdefault(cpu_identity(), {})[model] = losses
                continue
            if own is not None and model in own:
                want = own[model]
            for key, bits in losses.items():
                if bits != want[key]:
                    failures.append(f"{model}: resumed {key} {bits}, the old build gave {want[key]}")
            print(f"{model}: {'differs' if failures and failures[-1].startswith(model + ':') else 'ok'}")
    if record:
        fixture["cpu"] = vector_extensions()
    if record or record_cpu:
        with open(FIXTURE, "w") as f:
            json.dump(fixture, f, indent=1, sort_keys=True)
            f.write("\n")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
