#!/usr/bin/env bash
# Why a training step's kernels run at the rate they do: ncu on the kernels of one step whose
# names match NAME_REGEX, or (GROUPS_REGEX set) on the fused groups whose `dump --kernels`
# description matches it ("25 ops .*\[512, 512, 4, 4\]"). Per kernel: duration, grid and block,
# registers, achieved occupancy, the SM's compute and the memory system's throughputs, warp
# cycles per issued instruction and the largest stall reasons. The full ncu report goes to
# OUT_DIR/ncu.txt.
#   [MODEL=resnet18] [PRECISION=bf16] [BATCH=512] [LAUNCHES=4] [GROUPS_REGEX=...] \
#     bench/ncu_kernels.sh BIN_DIR OUT_DIR [NAME_REGEX]
# BIN_DIR: build/tools, or a gpu-pack's .gpu/bin. Example (stage 1's weight gradients):
#   bench/ncu_kernels.sh .gpu/bin /tmp/ncu 'kiln_conv_wgrad_tma_64x192'
set -uo pipefail
bin=$1
out=$2
names=${3:-}
mkdir -p "$out"
model=${MODEL:-resnet18}
precision=${PRECISION:-bf16}
batch=${BATCH:-512}
if [ -n "${GROUPS_REGEX:-}" ]; then
  names=$("$bin/dump" --model "$model" --precision "$precision" --batch-size "$batch" --kernels \
    2>/dev/null | grep -E "^kiln_[0-9a-f]+ \(%[0-9]+\): $GROUPS_REGEX" | cut -d' ' -f1 |
    sort -u | paste -sd'|')
fi
if [ -z "$names" ]; then
  echo "ncu_kernels: no kernel names (give NAME_REGEX, or a GROUPS_REGEX that dump matches)" >&2
  exit 2
fi
echo "== ncu on $model $precision b$batch: $names"
timeout 300 ncu --kernel-name "regex:($names)" --launch-count "${LAUNCHES:-4}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  "$bin/trainer" --model "$model" --device cuda --precision "$precision" --batch-size "$batch" \
  --data synthetic --epochs 1 --max-steps 2 --no-progress --streams 1 > "$out/ncu.txt" 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|Grid Size|Block Size|Registers Per Thread|Achieved Occupancy|\
Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|\
Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Executed Ipc Active" "$out/ncu.txt"
# The stall reasons ncu names in its WarpStateStats advice, per kernel.
grep -E "^  [a-z_0-9]+ \(|stall|Stall" "$out/ncu.txt" | grep -vE "^\s*-+$" | head -80
