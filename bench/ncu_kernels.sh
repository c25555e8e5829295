#!/usr/bin/env bash
# Why a training step's kernels run at the rate they do: ncu on the kernels of one step whose
# names match NAME_REGEX, or (GROUPS_REGEX set) on the fused groups whose `dump --kernels`
# description matches it ("25 ops .*\[512, 512, 4, 4\]"). Per kernel: duration, grid and block,
# registers, achieved occupancy, the SM's compute and the memory system's throughputs, warp
# cycles per issued instruction and the largest stall reasons. The full ncu report goes to
# OUT_DIR/ncu.txt.
#   [MODEL=resnet18] [PRECISION=bf16] [BATCH=512] [LAUNCHES=4] [GROUPS_REGEX=...] [STALLS=1] \
#     bench/ncu_kernels.sh BIN_DIR OUT_DIR [NAME_REGEX]
# STALLS=1 also measures every stall reason's warp cycles per issued instruction
# (smsp__average_warps_issue_stalled_*_per_issue_active) and prints them largest first.
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
stalls=()
[ "${STALLS:-0}" = 1 ] &&
  stalls=(--metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio")
timeout 300 ncu --kernel-name "regex:($names)" --launch-count "${LAUNCHES:-4}" "${stalls[@]}" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  "$bin/trainer" --model "$model" --device cuda --precision "$precision" --batch-size "$batch" \
  --data synthetic --epochs 1 --max-steps 2 --no-progress --streams 1 > "$out/ncu.txt" 2>&1
grep -E "^  [a-z_0-9]+ \(|Duration|Grid Size|Block Size|Registers Per Thread|Achieved Occupancy|\
Compute \(SM\) Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|\
Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Executed Ipc Active" "$out/ncu.txt"
# The stall reasons ncu names in its WarpStateStats advice, per kernel.
grep -E "^  [a-z_0-9]+ \(|stall|Stall" "$out/ncu.txt" | grep -vE "^\s*-+$" | head -80
if [ "${STALLS:-0}" = 1 ]; then  # per kernel, the reasons above 0.1 cycles, largest first
  awk '/^  [a-z_0-9]+ \(/ { if (n) flush(); name = $1; n = 0 }
       /smsp__average_warps_issue_stalled_/ { v = $NF; gsub(",", "", v); if (v + 0 > 0.1) {
         r = $1; sub("smsp__average_warps_issue_stalled_", "", r); sub("_per_issue_active.ratio", "", r);
         line[n++] = sprintf("%8.2f  %s", v, r) } }
       function flush() { print "-- stalls of " name; cmd = "sort -rn"; for (i = 0; i < n; i++) print line[i] | cmd; close(cmd) }
       END { if (n) flush() }' "$out/ncu.txt"
fi
