#!/usr/bin/env python3
"""kiln's GPU training step against PyTorch's best, side by side in one call (issues 17, 18).

For each model and batch: kiln's `bench --device cuda` in fp32 and bf16 (a subprocess; its
device time, the CUDA events around the step, and its wall time), and the same step written in
PyTorch (torch_zoo.py) in fp32 (TF32 off) and bf16 autocast (CNNs channels-last), each the
whole step captured as one CUDA graph and replayed ("the best PyTorch step"), timed with CUDA
events as the median of --steps replays after a warm-up; a step that cannot be captured is
timed eagerly and marked so. --rounds repeats everything, each round every program once, and
the tables use the median of the rounds.

    python3 bench/gpu_vs_pytorch.py --bench .gpu/bin/bench --batch 64 256 --json out.json

Prints, per model and batch, kiln's device ms (fp32, bf16), PyTorch's (fp32, bf16), and the
ratios issue 17 asks about: kiln bf16 / kiln fp32 and kiln bf16 / PyTorch bf16 (below 1:
kiln is faster); for the GANs (whose figure is wall time) also kiln's wall ms.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

import torch_zoo

MODELS = ["lenet", "resnet", "vgg", "alexnet", "inception", "row-lstm", "char-lstm", "gan",
          "dcgan", "resnet18"]


def time_torch(name, batch, precision, warmup, steps):
    """Median device ms of the captured step (or the eager one if capture fails), and how."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    return torch_zoo.time_cuda(torch_zoo.STEPS[name](batch, "cuda", precision), warmup, steps)


def time_kiln(bench, name, batches, precision, warmup, steps):
    """{batch: (device ms, wall ms)} from one bench process."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bench, "--device", "cuda", "--model", name, "--precision", precision,
               "--warmup", str(warmup), "--steps", str(steps), "--json", out.name,
               "--batch-size"] + [str(b) for b in batches]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {run.stderr.strip()[-500:]}")
        rows = json.load(open(out.name))
        rows = rows["results"] if isinstance(rows, dict) else rows
    return {b: (r["device_median_ms"], r["median_ms"]) for b, r in zip(batches, rows)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="kiln's bench binary")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    header = (f"{'model':<10} {'batch':>5} {'kiln fp32':>9} {'kiln bf16':>9} {'torch fp32':>10} "
              f"{'torch bf16':>10} {'bf16/fp32':>9} {'bf16/torch':>10} {'fp32/torch':>10} "
              f"{'kiln wall fp32/bf16':>19}")
    print(header, flush=True)
    results = []
    for name in args.models.split(","):
        rounds = []
        for _ in range(args.rounds):
            kiln = {p: time_kiln(args.bench, name, args.batch, p, args.warmup, args.steps)
                    for p in ("fp32", "bf16")}
            torch_ms = {(b, p): time_torch(name, b, p, args.warmup, args.steps)
                        for b in args.batch for p in ("fp32", "bf16")}
            rounds.append((kiln, torch_ms))
        for b in args.batch:
            med = lambda f: statistics.median(f(k, t) for k, t in rounds)  # noqa: E731
            kf, kb = med(lambda k, t: k["fp32"][b][0]), med(lambda k, t: k["bf16"][b][0])
            wf, wb = med(lambda k, t: k["fp32"][b][1]), med(lambda k, t: k["bf16"][b][1])
            tf, tb = med(lambda k, t: t[(b, "fp32")][0]), med(lambda k, t: t[(b, "bf16")][0])
            how = {p: rounds[0][1][(b, p)][1] for p in ("fp32", "bf16")}
            mark = lambda p: "" if how[p] == "graph" else "*"  # noqa: E731
            print(f"{name:<10} {b:>5} {kf:>9.3f} {kb:>9.3f} {tf:>9.3f}{mark('fp32'):1} "
                  f"{tb:>9.3f}{mark('bf16'):1} {kb / kf:>9.3f} {kb / tb:>10.3f} {kf / tf:>10.3f} "
                  f"{wf:>9.3f}/{wb:<9.3f}", flush=True)
            results.append({"model": name, "batch": b,
                            "kiln_fp32_device_ms": kf, "kiln_bf16_device_ms": kb,
                            "kiln_fp32_wall_ms": wf, "kiln_bf16_wall_ms": wb,
                            "torch_fp32_ms": tf, "torch_bf16_ms": tb,
                            "torch_timed": how, "rounds": args.rounds,
                            "kiln_bf16_over_fp32": kb / kf, "kiln_bf16_over_torch_bf16": kb / tb,
                            "kiln_fp32_over_torch_fp32": kf / tf})
    print("* PyTorch eager (the step could not be captured)")
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
               "bench": os.path.abspath(args.bench), "results": results},
              open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
