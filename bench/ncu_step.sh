#!/usr/bin/env bash
# Every kernel of one captured training step and its duration: ncu profiles the CUDA graph's
# nodes one at a time (--graph-profiling node) after the warm-up, at the clocks the GPU runs at
# (--clock-control none). A traced step (trainer --trace) runs launch by launch with events
# around each kernel and its small kernels' times come out several times too long; this does not,
# but each kernel runs alone, so the sum exceeds the step's device time wherever streams overlap.
#   [MODEL=lenet] [PRECISION=fp32] [BATCH=64] [KERNELS=34] [SKIP=400] bench/ncu_step.sh BIN_DIR
# KERNELS: the step's kernel count (`dump --device cuda` lists them); SKIP: launches to pass
# first (the warm-up's and the first steps', which run outside the graph). BIN_DIR: build/tools,
# or a gpu-pack's .gpu/bin. (Session 42 ran this inline for lenet fp32 b64: bench/README.md.)
set -uo pipefail
bin=$1
csv=$(mktemp)
timeout 300 ncu --clock-control none --graph-profiling node --launch-skip "${SKIP:-400}" \
  --launch-count "${KERNELS:-34}" --metrics gpu__time_duration.sum --csv --page raw \
  "$bin/bench" --device cuda --model "${MODEL:-lenet}" --precision "${PRECISION:-fp32}" \
  --batch-size "${BATCH:-64}" --warmup 10 --steps 20 > "$csv" 2> "$csv.err"
python3 - "$csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if head is None:
    print(open(sys.argv[1]).read()[-1500:])
    sys.exit(1)
h = rows[head]
name, dur = h.index("Kernel Name"), h.index("gpu__time_duration.sum")
scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(rows[head + 1][dur], 1e-3)
total = 0.0
for r in rows[head + 2:]:
    if len(r) <= dur:
        continue
    us = float(r[dur].replace(",", "")) * scale
    total += us
    print(f"{us:8.2f}  {r[name][:110]}")
print(f"{total:8.2f}  us in all, {len(rows) - head - 2} kernels")
PY
status=$?
tail -3 "$csv.err"
rm -f "$csv" "$csv.err"
exit $status
