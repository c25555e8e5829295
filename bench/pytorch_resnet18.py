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
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBn(nn.Module):
    def __init__(self, cin, cout, kernel=3, stride=1, relu=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = relu

    def forward(self, x):
        y = self.bn(self.conv(x))
        return F.relu(y) if self.relu else y


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = ConvBn(cin, cout, 3, stride)
        self.conv2 = ConvBn(cout, cout, 3, 1, relu=False)
        self.projection = (ConvBn(cin, cout, 1, stride, relu=False)
                           if stride != 1 or cin != cout else None)

    def forward(self, x):
        shortcut = self.projection(x) if self.projection is not None else x
        return F.relu(self.conv2(self.conv1(x)) + shortcut)


class ResNet18(nn.Module):
    def __init__(self, in_channels=3, classes=10):
        super().__init__()
        self.stem = ConvBn(in_channels, 64)
        blocks, channels = [], 64
        for stage in (64, 128, 256, 512):
            blocks += [BasicBlock(channels, stage, 1 if stage == 64 else 2),
                       BasicBlock(stage, stage, 1)]
            channels = stage
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_step(mode, batch):
    """The mode's backend flags set, and its eager training step: (step, model, opt, x, y)."""
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    torch.backends.cudnn.benchmark = True
    low = mode.startswith("bf16")
    fmt = torch.channels_last if low else torch.contiguous_format
    model = ResNet18().cuda().to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 32, 32, device="cuda").to(memory_format=fmt)
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=low):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    return step, model, opt, x, y


def time_mode(mode, batch, steps, warmup):
    step, model, opt, x, y = make_step(mode, batch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    run = step
    if mode == "bf16-graph":
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        run = graph.replay
    times = []
    for _ in range(steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**20


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

    step = make_step(mode.replace("-graph", ""), batch)[0]
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
