#!/usr/bin/env bash
# Issue 21's figures on a machine with two GPUs (the device tool's nvidia-h200-x2), in one call
# (estimated 6 minutes on 2 H200s; on 2 CPU processes sections 1, 3 and 4 took 2.5): data parallelism of char-lstm, the MLP GAN and dcgan (dcgan's batch norms
# synchronised: --sync-batch-norm), and resnet18's scaling.
#   1. each task, 100 steps: one GPU at batch 2B beside two GPUs at B each (the same global
#      batch; replicas checked every 50 steps) and, as the yardstick of float32 rounding, one
#      CPU process at 2B: the largest relative loss difference over steps 1-N;
#   2. final quality, the same pairs: char-lstm's validation bits per character after 5
#      epochs, the GANs' FID (a lenet checkpoint trained first) after 20 and 6 epochs;
#   3. bench --gpus 2 at the default batch per GPU and at 4x it (scaling efficiency), resnet18
#      bf16 at 256 per GPU; a traced 2-GPU step of each task, with the all-reduces' share
#      hidden under the backward (bench/trace_summary.py --overlap);
#   4. a rank killed mid-run, for each task.
#   bash bench/data_parallel_tasks.sh BIN_DIR OUT_DIR FASHION_MNIST_DIR FORTUNES_DIR [PARTS]
# PARTS: the sections to run, e.g. "1 3" (default "1 2 3 4"). DP_CPU=1 runs the same on CPU
# processes (--ranks 2) to try the script where there is no GPU.
set -u
BIN=${1:?usage: data_parallel_tasks.sh BIN_DIR OUT_DIR DATA_DIR FORTUNES_DIR [PARTS]}
OUT=${2:?usage: data_parallel_tasks.sh BIN_DIR OUT_DIR DATA_DIR FORTUNES_DIR [PARTS]}
DATA=${3:?usage: data_parallel_tasks.sh BIN_DIR OUT_DIR DATA_DIR FORTUNES_DIR [PARTS]}
TEXT=${4:?usage: data_parallel_tasks.sh BIN_DIR OUT_DIR DATA_DIR FORTUNES_DIR [PARTS]}
PARTS=${5:-1 2 3 4}
mkdir -p "$OUT/samples"
export NCCL_NVLS_ENABLE=0 KILN_CACHE_DIR=${KILN_CACHE_DIR:-$OUT/kernel-cache}
TR="$BIN/trainer --no-progress"
DEV=cuda TWO="--gpus 2"
[[ ${DP_CPU:-0} == 1 ]] && DEV=cpu TWO="--ranks 2 --device cpu"
declare -A ARGS=(
  [char-lstm]="--text $TEXT"
  [gan]="--data-dir $DATA --samples-dir $OUT/samples"
  [dcgan]="--data-dir $DATA --samples-dir $OUT/samples --sync-batch-norm"
)
declare -A BATCH=([char-lstm]=64 [gan]=64 [dcgan]=64)  # the defaults per GPU
TASKS="char-lstm gan dcgan"
part() { [[ " $PARTS " == *" $1 "* ]]; }

if part 1; then
  for m in $TASKS; do
    b=${BATCH[$m]}
    echo "== 1. $m, 100 steps: 1 GPU x $((2 * b)), 2 GPUs x $b, CPU x $((2 * b))"
    common="$TR --model $m ${ARGS[$m]} --max-steps 100 --metrics-every 1"
    $common --device $DEV --batch-size $((2 * b)) --metrics "$OUT/$m-one.jsonl" >"$OUT/$m-one.txt" 2>&1
    $common $TWO --batch-size "$b" --check-replicas 50 --metrics "$OUT/$m-two.jsonl" >"$OUT/$m-two.txt" 2>&1 ||
      { echo "2 GPUs failed:"; tail -5 "$OUT/$m-two.txt"; }
    $common --device cpu --batch-size $((2 * b)) --metrics "$OUT/$m-cpu.jsonl" >"$OUT/$m-cpu.txt" 2>&1
    python3 - "$m" "$OUT/$m-one.jsonl" "$OUT/$m-two.jsonl" "$OUT/$m-cpu.jsonl" <<'PY'
import json, sys
model, paths = sys.argv[1], sys.argv[2:]
keys = ["loss"] if model == "char-lstm" else ["d_loss", "g_loss"]
def read(p):
    try:
        return [l for l in map(json.loads, open(p)) if l["kind"] == "step"]
    except OSError:
        return []
one, two, cpu = map(read, paths)
def worst(a, b, upto):
    pairs = list(zip(a[:upto], b[:upto]))
    if len(pairs) < upto:
        return "missing"
    return f"{max(abs(x[k] - y[k]) / abs(x[k]) for x, y in pairs for k in keys):.1e}"
print(f"{model}: steps {len(one)} / {len(two)} / {len(cpu)}")
for upto in (1, 10, 50, 100):
    print(f"  steps 1-{upto}: 2 GPUs vs 1 GPU {worst(one, two, upto)}; CPU vs 1 GPU {worst(one, cpu, upto)}")
PY
    grep -i "replica" "$OUT/$m-two.txt" | tail -2
  done
fi

if part 2; then
  echo "== 2. final quality"
  $TR --model lenet --device $DEV --data-dir "$DATA" --epochs 2 --checkpoint "$OUT/lenet.safetensors" | tail -1
  for m in $TASKS; do
    b=${BATCH[$m]}
    case $m in
      char-lstm) q="--epochs 5 --lr 2e-3" ;;
      gan) q="--epochs 20 --fid-classifier $OUT/lenet.safetensors" ;;
      dcgan) q="--epochs 6 --fid-classifier $OUT/lenet.safetensors" ;;
    esac
    echo "-- $m: 1 GPU x $((2 * b)), then 2 GPUs x $b"
    $TR --model "$m" ${ARGS[$m]} $q --device $DEV --batch-size $((2 * b)) | tail -1
    $TR --model "$m" ${ARGS[$m]} $q $TWO --batch-size "$b" --check-replicas 50 | tail -1
  done
fi

if part 3; then
  echo "== 3. scaling (bench --gpus 2), traces"
  for m in $TASKS; do
    b=${BATCH[$m]}
    sync=""
    [[ $m == dcgan ]] && sync=--sync-batch-norm
    "$BIN/bench" --device $DEV --model "$m" --batch-size "$b" $((4 * b)) ${TWO/--device cpu/} $sync --steps 100 \
      --json "$OUT/scaling-$m.json"
    $TR --model "$m" ${ARGS[$m]} $TWO --batch-size "$b" --max-steps 12 --trace "$OUT/trace-$m.json" >/dev/null 2>&1
    [[ -f $OUT/trace-$m.json ]] && python3 "$(dirname "$0")/trace_summary.py" "$OUT/trace-$m.json" --overlap | tail -4
  done
  if [[ $DEV == cuda ]]; then
    "$BIN/bench" --device cuda --model resnet18 --precision bf16 --batch-size 256 --gpus 2 --steps 50 \
      --json "$OUT/scaling-resnet18-bf16.json"
    "$BIN/bench" --device cuda --model resnet18 --batch-size 256 --gpus 2 --steps 20 \
      --json "$OUT/scaling-resnet18-fp32.json"
  fi
fi

if part 4; then
  echo "== 4. a rank killed mid-run"
  for m in $TASKS; do
    metrics="$OUT/kill-$m.jsonl"
    timeout 120 $TR --model "$m" ${ARGS[$m]} $TWO --epochs 100 --init-timeout 30 --metrics-every 1 \
      --metrics "$metrics" >"$OUT/kill-$m.txt" 2>&1 &
    launcher=$!
    victim=""
    for _ in $(seq 600); do
      victim=$(pgrep -f -- "$metrics --rank 1 --world-size 2" | head -1)
      [[ -n $victim && -f $metrics ]] && (($(wc -l <"$metrics") >= 20)) && break
      sleep 0.1
    done
    start=$(date +%s.%N)
    if [[ -n $victim ]]; then kill -9 "$victim"; else echo "-- $m: rank 1 never trained"; kill "$launcher"; fi
    wait "$launcher"
    echo "-- $m: launcher exit code $?, $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s after the kill:"
    grep -v "^epoch\|^kiln trainer" "$OUT/kill-$m.txt" | tail -4
  done
fi
