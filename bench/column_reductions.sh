#!/usr/bin/env bash
# Checks and times the generated column reductions (fusion/codegen_columns.cpp) on a GPU:
# their GPU tests; resnet18's bf16 step with the channels-last values off, on, and on with
# KILN_COLUMN_HOIST=0 (row-invariant inputs loaded every row), alternated ROUNDS times
# (default 2); then ncu on stage 1's statistics and 27-op backward groups (found by name in
# `dump --kernels`): duration, block, registers, occupancy. Writes the full ncu output under
# OUT_DIR.
#   [ROUNDS=N] bench/column_reductions.sh [BIN_DIR] [OUT_DIR]   (BIN_DIR: build/tools, or a
#   gpu-pack's .gpu/bin)
set -uo pipefail
bin=${1:-build/tools}
tests=$(dirname "$bin")/tests  # the build tree's; a gpu-pack keeps them beside the tools
[ -x "$bin/fusion_tests" ] && tests=$bin
out=${2:-$(mktemp -d)}
mkdir -p "$out"
echo "== GPU tests"
"$tests/fusion_tests" -tc="*column*,*global average*,*channel statistics*" 2>&1 |
  grep -E "ERROR|values:|test cases|assertions" | head -20
echo "== resnet18 bf16 step, device ms: values off; on; on without hoisting"
for round in $(seq "${ROUNDS:-2}"); do
  for config in "0 1" "1 1" "1 0"; do
    read -r values hoist <<< "$config"
    echo "KILN_CHANNELS_LAST_VALUES=$values KILN_COLUMN_HOIST=$hoist (round $round)"
    KILN_CHANNELS_LAST_VALUES=$values KILN_COLUMN_HOIST=$hoist "$bin/bench" --device cuda \
      --model resnet18 --precision bf16 --batch-size 128 512 --steps 20 2>&1 | grep "\[bf16\]"
  done
done
for hoist in 1 0; do
  names=$(KILN_CHANNELS_LAST_VALUES=1 KILN_COLUMN_HOIST=$hoist "$bin/dump" --model resnet18 \
    --precision bf16 --batch-size 512 --kernels 2>/dev/null |
    grep -E "^kiln_[0-9a-f]+ \(%[0-9]+\): (25|27) ops .*\[512, 32, 32, 64\]" |
    cut -d' ' -f1 | sort -u | paste -sd'|')
  echo "== ncu, KILN_COLUMN_HOIST=$hoist: $names"
  KILN_CHANNELS_LAST_VALUES=1 KILN_COLUMN_HOIST=$hoist timeout 200 ncu --kernel-name "regex:($names)" \
    --launch-count 4 --section SpeedOfLight --section Occupancy --section LaunchStats \
    "$bin/trainer" --model resnet18 --device cuda --precision bf16 --batch-size 512 \
    --data synthetic --epochs 1 --max-steps 2 --no-progress --streams 1 > "$out/ncu-hoist-$hoist.txt" 2>&1
  grep -E "^  kiln_|Duration|DRAM Throughput|Registers Per|Achieved Occ|Theoretical Occ" \
    "$out/ncu-hoist-$hoist.txt" | head -40
done
