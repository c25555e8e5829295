#!/usr/bin/env python3
"""bench --ranks 2 (CPU processes over TCP, the path --gpus takes with NCCL) for a classifier,
the language model and both GANs: each gives its one-process row and a 2-rank row with the
ranks, the all-reduce count and a scaling efficiency; a GAN's row counts both programs'
all-reduces, and dcgan's --sync-batch-norm adds its batch norms' (one in each forward, one in
each backward).

    python3 tests/bench_parallel_test.py build/tools/bench
"""
import json
import os
import subprocess
import sys
import tempfile

CASES = [("lenet", []), ("char-lstm", []), ("gan", []), ("dcgan", []),
         ("dcgan", ["--sync-batch-norm"])]


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def scaling_row(bench, model, extra, tmp):
    path = os.path.join(tmp, f"{model}{len(extra)}.json")
    run = subprocess.run([bench, "--model", model, "--device", "cpu", "--threads", "1",
                          "--batch-size", "4", "--steps", "2", "--warmup", "1", "--ranks", "2",
                          "--json", path] + extra, capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        fail(f"{model} {extra}: exit code {run.returncode}\n{run.stderr}")
    with open(path) as f:
        rows = json.load(f)
    if len(rows) != 2:
        fail(f"{model} {extra}: {len(rows)} rows, expected the one-process row and the 2-rank row")
    two = rows[1]
    for key in ("ranks", "all_reduce_ops", "scaling_efficiency", "median_ms"):
        if key not in two:
            fail(f"{model} {extra}: the 2-rank row has no {key}: {two}")
    if two["ranks"] != 2 or two["all_reduce_ops"] < 1 or not two["scaling_efficiency"] > 0:
        fail(f"{model} {extra}: {two}")
    return two


def main():
    bench = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="kiln_bench_parallel.") as tmp:
        reduces = {}
        for model, extra in CASES:
            row = scaling_row(bench, model, extra, tmp)
            reduces[(model, bool(extra))] = row["all_reduce_ops"]
            print(f"ok [{' '.join([model] + extra)}: {row['name']}, {row['all_reduce_ops']} "
                  f"all-reduces, efficiency {row['scaling_efficiency']:.3f}]")
        # A synchronised batch norm takes 1 all-reduce forward (the ranks' statistics) and 1
        # backward. D's step: G's 2 batch norms forward only (its output is detached), D's 1
        # twice (real, fake) both ways; G's step: G's 2 and D's 1, both ways.
        added = reduces[("dcgan", True)] - reduces[("dcgan", False)]
        if added != 2 * 1 + 2 * 2 + (2 + 1) * 2:
            fail(f"dcgan: --sync-batch-norm added {added} all-reduces, expected 12")
    return 0


if __name__ == "__main__":
    sys.exit(main())
