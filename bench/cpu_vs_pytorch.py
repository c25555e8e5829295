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
PyTorch (the models and steps of torch_zoo.py) runs in float32 on the CPU with
torch.set_num_threads(N), eager, its default environment; kiln's bench in its own default (a bounded spin, tools/openmp_defaults.h; --passive
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

import torch_zoo


# name, batch: the models of issue 20's table (the steps: torch_zoo.py, shared with the GPU's)
MODELS = [("lenet", 64), ("resnet", 64), ("vgg", 64), ("char-lstm", 64), ("gan", 64),
          ("dcgan", 64), ("resnet18", 32)]


def time_torch(name, batch, warmup, steps):
    step = torch_zoo.STEPS[name](batch, "cpu", "fp32")
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
    for name, batch in MODELS:
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
            round_ms = time_torch(name, batch, args.warmup, args.steps)
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
