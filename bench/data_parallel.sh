#!/usr/bin/env bash
# The data-parallel figures of issue #8 on a machine with two GPUs:
#   1. lenet, 100 steps: one GPU at batch 128 beside two GPUs at 64 each (the same global
#      batch): the loss of every step, and the test accuracy after 2 epochs;
#   2. bench: the step on one GPU and on two, and the scaling efficiency (resnet at 256 per
#      GPU, lenet at 64 and 256);
#   3. a replica check every 50 steps, and a rank killed mid-run.
#   bash bench/data_parallel.sh BUILD_BIN_DIR OUT_DIR [FASHION_MNIST_DIR]
set -u
BIN=${1:?usage: data_parallel.sh BIN_DIR OUT_DIR [DATA_DIR]}
OUT=${2:?usage: data_parallel.sh BIN_DIR OUT_DIR [DATA_DIR]}
DATA=${3:-/usr/share/datasets/fashion-mnist}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT/kernel-cache}
TR="$BIN/trainer --no-progress --data-dir $DATA"
T="$TR --model lenet --lr 0.01"

echo "== 1. lenet, 1 GPU x 128 beside 2 GPUs x 64"
$T --device cuda --batch-size 128 --max-steps 100 --metrics-every 1 --metrics "$OUT/one.jsonl" >"$OUT/one.txt" 2>&1
$T --gpus 2 --batch-size 64 --max-steps 100 --metrics-every 1 --metrics "$OUT/two.jsonl" >"$OUT/two.txt" 2>&1
# The yardstick of float32 tolerance: the same one-process step on the CPU (other summation orders).
$T --device cpu --batch-size 128 --max-steps 100 --metrics-every 1 --metrics "$OUT/cpu.jsonl" >"$OUT/cpu.txt" 2>&1
python3 - "$OUT/one.jsonl" "$OUT/two.jsonl" "$OUT/cpu.jsonl" <<'PY'
import json, sys
read = lambda p: [json.loads(l)["loss"] for l in open(p) if json.loads(l)["kind"] == "step"]
one, two, cpu = read(sys.argv[1]), read(sys.argv[2]), read(sys.argv[3])
def worst(a, b, upto):
    rel = [abs(x - y) / abs(x) for x, y in zip(a[:upto], b[:upto])]
    return f"{max(rel):.1e}"
print(f"steps: {len(one)}, {len(two)}, {len(cpu)}; loss at step 1: {one[0]:.7f} (1 GPU) {two[0]:.7f} (2 GPUs) {cpu[0]:.7f} (CPU);"
      f" step 100: {one[-1]:.6f} {two[-1]:.6f} {cpu[-1]:.6f}")
rate = lambda p: sorted(json.loads(l)["images_per_second"] for l in open(p) if json.loads(l)["kind"] == "step")[50]
print(f"median images/s per step line: 1 GPU {rate(sys.argv[1]):.0f}, 2 GPUs {rate(sys.argv[2]):.0f}")
for upto in (1, 10, 50, 100):
    print(f"largest relative difference over steps 1-{upto}: 2 GPUs vs 1 GPU {worst(one, two, upto)}; CPU vs 1 GPU {worst(one, cpu, upto)}")
PY
echo "== lenet, defaults, 2 epochs: 1 GPU x 128, then 2 GPUs x 64 (replicas checked every 50 steps)"
$TR --model lenet --device cuda --batch-size 128 --epochs 2 | tail -1
$TR --model lenet --gpus 2 --batch-size 64 --epochs 2 --check-replicas 50 | tail -1
echo "== resnet, 5 epochs, lr 2e-3, warm-up 500: 1 GPU x 128, then 2 GPUs x 64"
$TR --model resnet --device cuda --batch-size 128 --epochs 5 --lr 2e-3 --warmup-steps 500 | tail -1
$TR --model resnet --gpus 2 --batch-size 64 --epochs 5 --lr 2e-3 --warmup-steps 500 | tail -1

echo "== 2. scaling"
"$BIN/bench" --device cuda --model resnet --batch-size 256 --gpus 2 --steps 30 --json "$OUT/resnet.json"
"$BIN/bench" --device cuda --model lenet --batch-size 64 256 --gpus 2 --steps 200 --json "$OUT/lenet.json"

echo "== 3. a rank killed mid-run"
$T --gpus 2 --batch-size 64 --epochs 100 --init-timeout 30 --metrics "$OUT/kill.jsonl" --metrics-every 1 >"$OUT/kill.txt" 2>&1 &
launcher=$!
for _ in $(seq 600); do
  victim=$(pgrep -f -- "--rank 1 --world-size 2" | head -1)
  [[ -n $victim && -f $OUT/kill.jsonl ]] && (($(wc -l <"$OUT/kill.jsonl") >= 20)) && break
  sleep 0.1
done
start=$(date +%s.%N)
kill -9 "$victim"
wait "$launcher"
echo "launcher exit code $?, $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s after the kill:"
cat "$OUT/kill.txt"
