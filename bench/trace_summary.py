#!/usr/bin/env python3
"""Per-kernel device time of a traced step (trainer --trace FILE): one row per kernel name
(total ms, share, launches), the heaviest first; with --passes, the convolution passes one by
one in launch order instead (with --streams 1 each is timed alone), to compare tile settings;
with --overlap, how much of each all-reduce (data parallelism) ran while kernels of the same
program on other streams did: the communication the backward hides; with --rates, every
launch that multiplies (convolutions, products: the trace's args "flops") at its TFLOP/s, in
launch order, then each kind's sum and the convolutions' share of the kernel time; with
--bandwidth, every kernel that does not multiply (fused groups, copies, reductions) by its
operands' bytes (the trace's args "bytes": each input once and each output, the least a launch
moves) and the GB/s that makes, the heaviest first: how far each is from the memory's rate;
with --timeline, every launch in start order (start and length in us from the step's first
launch, its stream, node and kernel name) and the time no stream ran a kernel: a small step's
critical path and its gaps.

  python3 bench/trace_summary.py TRACE.json [--top N]
      [--passes | --overlap | --rates | --bandwidth | --timeline]
"""
import argparse
import collections
import json
import signal

CONV_PASSES = ("conv2d", "conv2d_bias", "conv2d_moments", "conv2d_grad_input", "conv2d_grad_weight")


def print_passes(events):
    """One line per convolution pass kind: its sum and every launch's microseconds, in order."""
    events = sorted(events, key=lambda e: e["ts"])
    for name in CONV_PASSES:
        durations = [e["dur"] for e in events if e["name"] == name]
        print(f"{name:>18} sum {sum(durations):8.1f} us: " + " ".join(f"{d:.0f}" for d in durations))
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    print(f"{'step':>18} span {span:8.1f} us, {len(events)} launches")


def print_rates(events):
    """Each launch with a FLOP count: node, op, microseconds, GFLOP, TFLOP/s; then per kind."""
    events = sorted(events, key=lambda e: e["ts"])
    counted = [e for e in events if e.get("args", {}).get("flops", 0) > 0]
    if not counted:
        print("no launch in this trace counts its FLOPs (a trace from before args were written?)")
        return
    kinds = collections.OrderedDict()
    for e in counted:
        gflop = e["args"]["flops"] / 1e9
        rate = gflop / e["dur"] * 1e3 if e["dur"] > 0 else 0.0  # GFLOP / us -> TFLOP/s
        print(f"%{e['args']['node']:<6} {e['name']:>18} {e['dur']:9.1f} us {gflop:9.3f} GFLOP "
              f"{rate:7.1f} TFLOP/s")
        us, flop = kinds.get(e["name"], (0.0, 0.0))
        kinds[e["name"]] = (us + e["dur"], flop + gflop)
    total_us = sum(e["dur"] for e in events)
    conv_us = conv_gflop = 0.0
    for name, (us, gflop) in kinds.items():
        print(f"{name:>18} {us / 1000:8.3f} ms {gflop:9.1f} GFLOP "
              f"{gflop / us * 1e3 if us > 0 else 0.0:7.1f} TFLOP/s")
        if name in CONV_PASSES:
            conv_us += us
            conv_gflop += gflop
    if conv_us > 0:
        print(f"convolutions: {conv_us / 1000:.3f} of {total_us / 1000:.3f} ms of kernel time "
              f"({100 * conv_us / total_us:.1f} %), {conv_gflop:.1f} GFLOP at "
              f"{conv_gflop / conv_us * 1e3:.1f} TFLOP/s")


def print_bandwidth(events, top):
    """Each kernel name whose launches count bytes and no FLOPs: ms, launches, GB, TB/s."""
    kinds = collections.defaultdict(lambda: [0.0, 0, 0.0])  # us, launches, bytes
    for e in events:
        a = e.get("args", {})
        if a.get("bytes", 0) > 0 and a.get("flops", 0) == 0:
            kind = kinds[e["name"]]
            kind[0] += e["dur"]
            kind[1] += 1
            kind[2] += a["bytes"]
    if not kinds:
        print("no launch in this trace counts its bytes (a trace from before args were written?)")
        return
    us_all = sum(k[0] for k in kinds.values())
    gb_all = sum(k[2] for k in kinds.values()) / 1e9
    print(f"{us_all / 1000:.3f} ms, {gb_all:.3f} GB at {gb_all / us_all * 1e6 if us_all else 0:.0f} "
          f"GB/s in the launches that do not multiply")
    for name, (us, n, nbytes) in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:top]:
        rate = nbytes / us * 1e-3 if us > 0 else 0.0  # bytes / us -> GB/s
        print(f"{us / 1000:8.3f} ms {n:4d}x {nbytes / 1e9:8.3f} GB {rate:7.0f} GB/s  {name}")


def print_timeline(events):
    """Every launch in start order with its stream; then the step's span and its idle time."""
    events = sorted(events, key=lambda e: e["ts"])
    t0 = events[0]["ts"]
    print(f"{'start':>8} {'us':>7} {'stream':>6}  node    kernel")
    for e in events:
        node = e.get("args", {}).get("node", "")
        print(f"{e['ts'] - t0:8.1f} {e['dur']:7.1f} {e['tid']:>6}  %{node:<6} {e['name']}")
    span = max(e["ts"] + e["dur"] for e in events) - t0
    busy = covered(t0, t0 + span, [(e["ts"], e["ts"] + e["dur"]) for e in events])
    print(f"span {span:.1f} us, {len(events)} launches, a kernel running {busy:.1f} us, "
          f"none {span - busy:.1f} us")


def covered(start, end, spans):
    """Microseconds of [start, end) inside the union of `spans` ((start, end) pairs)."""
    total, reach = 0.0, start
    for s, e in sorted(spans):
        s, e = max(s, reach), min(e, end)
        if e > s:
            total += e - s
            reach = e
    return total


def print_overlap(events):
    """Each all_reduce_mean launch: its time and the share of it under other streams' kernels."""
    reduces = [e for e in events if e["name"] == "all_reduce_mean"]
    if not reduces:
        print("no all_reduce_mean in this trace (a one-process step?)")
        return
    hidden_sum = busy_sum = 0.0
    for r in sorted(reduces, key=lambda e: (e["pid"], e["ts"])):
        start, end = r["ts"], r["ts"] + r["dur"]
        others = [(e["ts"], e["ts"] + e["dur"]) for e in events
                  if e["pid"] == r["pid"] and e["tid"] != r["tid"] and e["name"] != "all_reduce_mean"]
        hidden = covered(start, end, others)
        hidden_sum += hidden
        busy_sum += r["dur"]
        share = 100 * hidden / r["dur"] if r["dur"] > 0 else 0.0
        print(f"program {r['pid']} stream {r['tid']}: all_reduce_mean {r['dur']:8.1f} us, "
              f"{share:5.1f} % under other streams' kernels")
    share = 100 * hidden_sum / busy_sum if busy_sum > 0 else 0.0
    print(f"{len(reduces)} all-reduces, {busy_sum:.1f} us, {share:.1f} % hidden")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--passes", action="store_true", help="the convolution passes in order")
    parser.add_argument("--overlap", action="store_true",
                        help="the all-reduces' time hidden under other streams' kernels")
    parser.add_argument("--rates", action="store_true",
                        help="each multiplying launch's TFLOP/s, and the convolutions' share")
    parser.add_argument("--bandwidth", action="store_true",
                        help="each other kernel's operand bytes and GB/s, the heaviest first")
    parser.add_argument("--timeline", action="store_true",
                        help="every launch in start order with its stream, and the idle time")
    args = parser.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the output quietly
    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    if args.passes:
        print_passes(events)
        return
    if args.overlap:
        print_overlap(events)
        return
    if args.rates:
        print_rates(events)
        return
    if args.bandwidth:
        print_bandwidth(events, args.top)
        return
    if args.timeline:
        print_timeline(events)
        return
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
