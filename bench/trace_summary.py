#!/usr/bin/env python3
"""Per-kernel device time of a traced step (trainer --trace FILE): one row per kernel name
(total ms, share, launches), the heaviest first.

  python3 bench/trace_summary.py TRACE.json [--top N]
"""
import argparse
import collections
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    total = collections.defaultdict(float)
    launches = collections.Counter()
    for e in events:
        total[e["name"]] += e["dur"] / 1000.0
        launches[e["name"]] += 1
    step_ms = sum(total.values())
    print(f"{len(events)} launches, {step_ms:.3f} ms of kernel time in all")
    rows = sorted(total.items(), key=lambda kv: -kv[1])
    for name, ms in rows[: args.top]:
        print(f"{ms:8.3f} ms {100 * ms / step_ms:5.1f} % {launches[name]:4d}x  {name}")


if __name__ == "__main__":
    main()
