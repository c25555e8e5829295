#!/usr/bin/env python3
"""kiln's CPU training step against PyTorch's, side by side on one machine (issue 20).

Runs kiln's `bench` (as a subprocess, --device cpu --threads N) and the same models written in
PyTorch (the shapes of models/*.cpp, the same losses and optimizers as the tasks' bench steps),
in turn, five rounds each (--rounds), in the current CPU affinity: pin the whole script with taskset, e.g.

    taskset -c 0,1 python3 bench/cpu_vs_pytorch.py --bench build/tools/bench --threads 2 --json out.json
    taskset -c 0-7 python3 bench/cpu_vs_pytorch.py --bench build/tools/bench --threads 8 --json out.json

Prints one line per model (median step time of each, kiln / PyTorch, and the median and range
of each round's own kiln / PyTorch, the steadier figure on a host whose speed drifts) and writes
the JSON.
PyTorch runs in float32 on the CPU with torch.set_num_threads(N), eager, its default
environment; kiln's bench in its own default (a bounded spin, tools/openmp_defaults.h; --passive
also times it with OMP_WAIT_POLICY=passive; a --base build with the same spin count).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv_bn(cin, cout, kernel=3, stride=1, relu=True):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)]
    if relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv_bn(cin, cout, 3, stride)
        self.conv2 = conv_bn(cout, cout, 3, 1, relu=False)
        self.projection = None
        if stride != 1 or cin != cout:
            self.projection = conv_bn(cin, cout, 1, stride, relu=False)

    def forward(self, x):
        shortcut = self.projection(x) if self.projection is not None else x
        return F.relu(self.conv2(self.conv1(x)) + shortcut)


def resnet_stages(stem_in, widths, first_stride_one):
    blocks, channels = [], widths[0]
    for i, width in enumerate(widths):
        stride = 1 if (i == 0 and first_stride_one) else 2
        blocks += [BasicBlock(channels, width, stride), BasicBlock(width, width, 1)]
        channels = width
    return nn.Sequential(conv_bn(stem_in, widths[0]), *blocks)


class ResNet14(nn.Module):  # models/resnet.cpp: ResNet
    def __init__(self):
        super().__init__()
        self.features = resnet_stages(1, [16, 32, 64], True)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(self.dropout(self.features(x).mean((2, 3))))


class ResNet18(nn.Module):  # models/resnet.cpp: ResNet18 (CIFAR form)
    def __init__(self):
        super().__init__()
        self.features = resnet_stages(3, [64, 128, 256, 512], True)
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc(self.features(x).mean((2, 3)))


def lenet():  # models/lenet.cpp
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def vgg():  # models/vgg.cpp
    return nn.Sequential(
        conv_bn(1, 16), conv_bn(16, 16), nn.MaxPool2d(2), conv_bn(16, 32), conv_bn(32, 32),
        nn.MaxPool2d(2), conv_bn(32, 64), conv_bn(64, 64), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(576, 256), nn.ReLU(), nn.Dropout(0.5), nn.Linear(256, 10))


class CharLstm(nn.Module):  # models/char_lstm.cpp: E 64, H 256, vocabulary 96, one layer
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(96, 64)
        self.rnn = nn.LSTM(64, 256)
        self.head = nn.Linear(256, 96)

    def forward(self, tokens):  # [T, B]
        out, _ = self.rnn(self.embedding(tokens))
        return self.head(out.reshape(-1, 256))


def mlp_gan():  # models/gan.cpp
    g = nn.Sequential(nn.Linear(100, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh(),
                      nn.Unflatten(1, (1, 28, 28)))
    d = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1))
    return g, d


def dcgan():  # models/dcgan.cpp
    g = nn.Sequential(
        nn.Linear(100, 128 * 7 * 7, bias=False), nn.Unflatten(1, (128, 7, 7)), nn.BatchNorm2d(128),
        nn.ReLU(), nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Tanh())
    d = nn.Sequential(
        nn.Conv2d(1, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1, bias=False),
        nn.BatchNorm2d(128), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(128 * 7 * 7, 1))
    return g, d


def classifier_step(model, x, y, optimizer):
    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()
    return step


def classifier(make, shape, batch):
    model = make()
    x = torch.rand((batch,) + shape) * 2 - 1
    y = torch.randint(0, 10, (batch,))
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)  # train/classifier_task.cpp
    return classifier_step(model, x, y, sgd)


def char_lstm(batch):
    model = CharLstm()
    tokens = torch.randint(0, 96, (64, batch))
    targets = torch.randint(0, 96, (64 * batch,))
    return classifier_step(model, tokens, targets, torch.optim.Adam(model.parameters()))


def gan(make, batch):  # train/gan_steps.h: a D step, then a G step; Adam lr 2e-4, beta1 0.5
    g, d = make()
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real = torch.rand(batch, 1, 28, 28) * 2 - 1
    ones, zeros = torch.ones(batch, 1), torch.zeros(batch, 1)
    bce = F.binary_cross_entropy_with_logits

    def step():
        z = torch.randn(batch, 100)
        opt_d.zero_grad(set_to_none=True)
        d_loss = bce(d(real), ones) + bce(d(g(z).detach()), zeros)
        d_loss.backward()
        opt_d.step()
        opt_g.zero_grad(set_to_none=True)
        g_loss = bce(d(g(torch.randn(batch, 100))), ones)
        g_loss.backward()
        opt_g.step()
        return d_loss.item() + g_loss.item()
    return step


# name, kiln model, batch, PyTorch step maker
MODELS = [
    ("lenet", 64, lambda b: classifier(lenet, (1, 28, 28), b)),
    ("resnet", 64, lambda b: classifier(ResNet14, (1, 28, 28), b)),
    ("vgg", 64, lambda b: classifier(vgg, (1, 28, 28), b)),
    ("char-lstm", 64, char_lstm),
    ("gan", 64, lambda b: gan(mlp_gan, b)),
    ("dcgan", 64, lambda b: gan(dcgan, b)),
    ("resnet18", 32, lambda b: classifier(ResNet18, (3, 32, 32), b)),
]


def time_torch(make_step, batch, warmup, steps):
    step = make_step(batch)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def time_kiln(bench, model, batch, threads, warmup, steps, wait="default"):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [bench, "--device", "cpu", "--model", model, "--batch-size", str(batch), "--threads",
               str(threads), "--warmup", str(warmup), "--steps", str(steps), "--json", out.name]
        # wait: "default" runs kiln as a user would, in its own default (tools/openmp_defaults.h:
        # idle threads spin about 0.2 ms, GOMP_SPINCOUNT=10000, then sleep; PyTorch keeps its
        # defaults too); "spin" sets that spin count explicitly (for a base build from before
        # kiln set it itself); "passive": idle threads sleep at once (OMP_WAIT_POLICY=passive).
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        if wait == "spin":
            env["GOMP_SPINCOUNT"] = "10000"
        elif wait == "passive":
            env["OMP_WAIT_POLICY"] = "passive"
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {run.stderr.strip()[-500:]}")
        rows = json.load(open(out.name))
        rows = rows["results"] if isinstance(rows, dict) else rows
        return rows[0]["median_ms"], rows[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", required=True, help="kiln's bench binary")
    parser.add_argument("--base", help="an earlier build's bench, timed once per model beside it")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--models", default=",".join(m[0] for m in MODELS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--base-models", default="lenet,resnet,vgg,char-lstm,gan,dcgan")
    parser.add_argument("--passive", action="store_true",
                        help="also time kiln with OMP_WAIT_POLICY=passive (idle threads sleep at once)")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    wanted = args.models.split(",")
    affinity = sorted(os.sched_getaffinity(0))
    print(f"torch {torch.__version__}, {args.threads} threads, cores {affinity}, "
          f"mkldnn {torch.backends.mkldnn.is_available()}", flush=True)
    print(f"{'model':<10} {'batch':>5} {'kiln ms':>9} {'torch ms':>9} {'kiln/torch':>10}"
          + f" {'by round':>8} {'range':>11}"
          + (f" {'base ms':>9} {'base/torch':>10} {'by round':>8}" if args.base else "")
          + (f" {'passive':>9} {'pass/torch':>10}" if args.passive else ""),
          flush=True)
    results = []
    for name, batch, make_step in MODELS:
        if name not in wanted:
            continue
        kiln_ms, torch_ms, kiln_rows, base_ms, passive_ms = [], [], [], [], []
        torch_rounds = []  # each round's PyTorch median, to pair with that round's kiln run
        with_base = args.base and name in args.base_models.split(",")
        for _ in range(args.rounds):  # each round every program once, so noise hits all alike
            median, row = time_kiln(args.bench, name, batch, args.threads, args.warmup, args.steps)
            kiln_ms.append(median)
            kiln_rows.append(row)
            if with_base:
                base_ms.append(time_kiln(args.base, name, batch, args.threads, args.warmup,
                                         args.steps, "spin")[0])
            if args.passive:
                passive_ms.append(time_kiln(args.bench, name, batch, args.threads, args.warmup,
                                            args.steps, "passive")[0])
            round_ms = time_torch(make_step, batch, args.warmup, args.steps)
            torch_ms += round_ms
            torch_rounds.append(statistics.median(round_ms))
        # The host's speed drifts between rounds by more than the effects measured, and each
        # round times every program back to back: the median of the rounds' own ratios is
        # the steadier figure; the ratio of the overall medians is kept beside it.
        by_round = [k / t for k, t in zip(kiln_ms, torch_rounds)]
        k = statistics.median(kiln_ms)
        t = statistics.median(torch_ms)
        row = {"model": name, "batch": batch, "threads": args.threads,
               "kiln_median_ms": k, "kiln_round_medians_ms": kiln_ms,
               "torch_median_ms": t, "torch_p10_ms": statistics.quantiles(torch_ms, n=10)[0],
               "kiln_over_torch": k / t, "torch_round_medians_ms": torch_rounds,
               "kiln_over_torch_by_round": by_round,
               "kiln_over_torch_median_of_rounds": statistics.median(by_round),
               "kiln_rows": kiln_rows}
        line = (f"{name:<10} {batch:>5} {k:>9.2f} {t:>9.2f} {k / t:>10.3f}"
                f" {statistics.median(by_round):>8.3f} {min(by_round):>5.2f}-{max(by_round):<5.2f}")
        if with_base:
            base = statistics.median(base_ms)
            row["base_median_ms"], row["base_round_medians_ms"] = base, base_ms
            base_by_round = [b / r for b, r in zip(base_ms, torch_rounds)]
            row["base_over_torch_median_of_rounds"] = statistics.median(base_by_round)
            line += f" {base:>9.2f} {base / t:>10.3f} {statistics.median(base_by_round):>8.3f}"
        if args.passive:
            passive = statistics.median(passive_ms)
            row["kiln_passive_median_ms"], row["kiln_passive_round_medians_ms"] = passive, passive_ms
            line += f" {passive:>9.2f} {passive / t:>10.3f}"
        print(line, flush=True)
        results.append(row)
    json.dump({"torch": torch.__version__, "threads": args.threads, "cores": affinity,
               "results": results}, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
