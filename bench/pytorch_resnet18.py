#!/usr/bin/env python3
"""PyTorch's training step of kiln's resnet18 (models/resnet.cpp: the CIFAR ResNet-18, a 3x3
stem of 64 channels, four stages of two basic blocks, 1x1 projection shortcuts with batch norm,
global average pooling, 10 classes; SGD with momentum 0.9, cross-entropy, random 3x32x32
inputs), timed on the GPU with CUDA events as the median of --steps steps, in each mode:

  fp32         plain fp32 (TF32 off)
  tf32         TF32 matmuls and convolutions
  bf16         autocast to bf16, channels_last
  bf16-graph   the same, the whole step captured as one CUDA graph and replayed

  python3 bench/pytorch_resnet18.py --batch 128 512 [--json OUT.json]

With --profile MODE, one batch's step is instead run under torch.profiler (eager, the same
kernels the captured graph replays) and its GPU kernels summed per convolution pass kind (the
library's kernel names say fprop, dgrad or wgrad) and per kernel: the anchor for kiln's own
per-pass trace (bench/trace_summary.py).
"""
import argparse
import json

import torch

import torch_zoo


def make_step(mode, batch):
    """The mode's backend flags set, and its eager training step (torch_zoo's ResNet18 and
    classifier step: SGD with momentum, bf16 modes channels-last under autocast)."""
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.benchmark = True
    precision = "bf16" if mode.startswith("bf16") else "fp32"
    return torch_zoo.STEPS["resnet18"](batch, "cuda", precision)


def time_mode(mode, batch, steps, warmup):
    ms, _ = torch_zoo.time_cuda(make_step(mode, batch), warmup, steps, mode == "bf16-graph")
    return ms, torch.cuda.max_memory_allocated() / 2**20


def kernel_class(name):
    lower = name.lower()
    for kind in ("fprop", "dgrad", "wgrad"):
        if kind in lower:
            return "conv " + kind
    if "gemm" in lower or "cutlass" in lower:
        return "gemm"
    if "batch_norm" in lower or "bn_" in lower:
        return "batch norm"
    return "other"


def profile_mode(mode, batch, steps):
    """Sums the step's GPU kernels by class and by name over `steps` profiled eager steps."""
    import collections
    from torch.profiler import ProfilerActivity, profile

    step = make_step(mode.replace("-graph", ""), batch)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_class, by_name, count = (collections.Counter(), collections.Counter(),
                                collections.Counter())
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        us = e.time_range.elapsed_us()
        by_class[kernel_class(e.name)] += us / steps
        by_name[e.name[:110]] += us / steps
        count[e.name[:110]] += 1
    total = sum(by_class.values())
    print(f"pytorch resnet18 batch {batch} {mode}: {total / 1000:.3f} ms of kernels a step")
    for c, us in by_class.most_common():
        print(f"  {c:<12} {us / 1000:8.3f} ms {100 * us / total:5.1f} %")
    for n, us in by_name.most_common(30):
        print(f"  {us:8.1f} us {count[n] // steps:4d}x {n}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--modes", nargs="+", default=["fp32", "tf32", "bf16", "bf16-graph"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--profile", metavar="MODE", help="profile one mode's kernels instead")
    args = parser.parse_args()
    if args.profile:
        for batch in args.batch:
            profile_mode(args.profile, batch, args.steps)
        return
    rows = []
    for batch in args.batch:
        for mode in args.modes:
            torch.cuda.reset_peak_memory_stats()
            ms, mib = time_mode(mode, batch, args.steps, args.warmup)
            rows.append({"model": "resnet18", "batch": batch, "mode": mode, "median_ms": ms,
                         "peak_mib": mib})
            print(f"pytorch resnet18 batch {batch:4d} {mode:<10} {ms:8.3f} ms {mib:8.1f} MiB",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
