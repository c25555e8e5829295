#!/bin/bash
# The 16-bit LSTM on the tensor-core kernels against the f32 recurrence, on the GPU machine
# (issues 17, 18): tests, an alternated A/B of the bench step, PyTorch side by side, ncu per
# kernel and the accuracy of char-lstm and row-lstm. Run from the repository root there:
#   bench/lstm_tensor_cores.sh NEW_BIN_DIR BASE_BENCH BASE_TRAINER DATA_DIR TEXT_DIR
# NEW_BIN_DIR holds this build's backends_tests, bench and trainer (gpu-pack's .gpu/bin);
# BASE_* are the same tools built at the commit to compare against; OUT (a directory) gets
# the logs. Prints a short table.
set -u
new=$1 base_bench=$2 base_trainer=$3 data=$4 text=$5
out=${OUT:-/tmp/lstm-tc}
mkdir -p "$out"
echo "== tests"
timeout 300 "$new/backends_tests" -tc="GPU lstm_sequence*" >"$out/lstm_tests.txt" 2>&1
echo "lstm tests rc=$?"
timeout 300 "$new/backends_tests" -tc="*in bf16 and f16 matches*" >"$out/low_precision.txt" 2>&1
echo "low-precision rows rc=$?"
timeout 300 "$new/backends_tests" -tc="*autocast*" >"$out/autocast.txt" 2>&1
echo "autocast rc=$?"
echo "== bench, device ms at batch 64 and 256 (base, new, base, new)"
for m in char-lstm row-lstm; do
  for p in bf16 fp16; do
    for round in 1 2; do
      for bin in "$base_bench" "$new/bench"; do
        ms=$("$bin" --device cuda --model $m --precision $p --batch-size 64 256 --warmup 20 \
          --steps 100 2>/dev/null | grep -E " ms" | awk '{print $(NF-1)}' | tr '\n' ' ')
        echo "$m $p round $round $bin: $ms"
      done
    done
  done
done
echo "== PyTorch side by side"
timeout 300 python3 bench/gpu_vs_pytorch.py --bench "$new/bench" --models char-lstm,row-lstm \
  --batch 64 256 --rounds 2 --json "$out/vs_pytorch.json" 2>&1 | tail -8
echo "== ncu: the LSTM kernels of char-lstm bf16"
for b in 64 256; do
  timeout 120 ncu -k regex:lstm --metrics gpu__time_duration.sum "$new/bench" --device cuda \
    --model char-lstm --precision bf16 --batch-size $b --warmup 1 --steps 1 >"$out/ncu_$b.txt" 2>&1
  echo "b$b: $(grep -cE '^\s+kiln_lstm' "$out/ncu_$b.txt") launches; log in $out/ncu_$b.txt"
done
echo "== accuracy: char-lstm 4 epochs (validation bits/char), row-lstm 2 epochs"
for run in "$new/trainer bf16" "$base_trainer bf16" "$new/trainer fp32"; do
  set -- $run
  echo "char-lstm $2 $1: $("$1" --model char-lstm --device cuda --precision "$2" --text "$text" \
    --epochs 4 --no-progress 2>&1 | tail -1)"
  echo "row-lstm $2 $1: $("$1" --model row-lstm --device cuda --precision "$2" --data-dir "$data" \
    --epochs 2 --no-progress 2>&1 | tail -1)"
done
