#!/usr/bin/env bash
# Checks and times the channels-last values (KILN_CHANNELS_LAST_VALUES=1; ARCHITECTURE.md) on a
# GPU: the GPU tests of the TMA passes' channels-last forms, of the column body and of
# resnet18's step with and without them; then resnet18's bf16 step at both batch sizes, the
# switch off, on with the column body's scalar form (KILN_COLUMN_VECTORS=0) and on, alternated
# ROUNDS times (default 2); then one-stream traces of b512 each way, summed by pass and by
# bandwidth. Writes the traces and summaries under OUT_DIR.
#   [ROUNDS=N] bench/channels_last_values.sh [BIN_DIR] [OUT_DIR]   (BIN_DIR: build/tools, or a
#   gpu-pack's .gpu/bin)
set -uo pipefail
bin=${1:-build/tools}
tests=$(dirname "$bin")/tests  # the build tree's; a gpu-pack keeps them beside the tools
[ -x "$bin/backends_tests" ] && tests=$bin
out=${2:-$(mktemp -d)}
mkdir -p "$out"
here=$(dirname "$0")
echo "== GPU tests"
"$tests/backends_tests" -tc="*channels-last*,*TMA passes write*" 2>&1 | grep -E "ERROR|values|test cases|assertions" | head -30
"$tests/fusion_tests" -tc="*channel statistics*" 2>&1 | grep -E "ERROR|values|test cases|assertions" | head -10
echo "== resnet18 bf16 step, device ms: the switch off, on with the column body's scalar form, on"
for round in $(seq "${ROUNDS:-2}"); do
  for config in "0 1" "1 0" "1 1"; do
    read -r values vectors <<< "$config"
    echo "KILN_CHANNELS_LAST_VALUES=$values KILN_COLUMN_VECTORS=$vectors (round $round)"
    KILN_CHANNELS_LAST_VALUES=$values KILN_COLUMN_VECTORS=$vectors "$bin/bench" --device cuda \
      --model resnet18 --precision bf16 --batch-size 128 512 --steps 30 2>&1 | grep "\[bf16\]"
  done
done
for values in 0 1; do
  echo "== one stream, b512, KILN_CHANNELS_LAST_VALUES=$values"
  KILN_CHANNELS_LAST_VALUES=$values "$bin/trainer" --model resnet18 --device cuda --precision bf16 \
    --batch-size 512 --data synthetic --epochs 1 --max-steps 12 --no-progress --streams 1 \
    --trace "$out/trace-$values.json" > /dev/null 2>&1
  python3 "$here/trace_summary.py" "$out/trace-$values.json" > "$out/summary-$values.txt" 2>&1
  head -14 "$out/summary-$values.txt"
  python3 "$here/trace_summary.py" "$out/trace-$values.json" --passes 2>&1 | head -6
  python3 "$here/trace_summary.py" "$out/trace-$values.json" --bandwidth > "$out/bandwidth-$values.txt" 2>&1
  head -25 "$out/bandwidth-$values.txt"
done
