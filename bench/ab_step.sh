#!/usr/bin/env bash
# A/B of a model's training step under several environment settings on a GPU: `bench` at each
# batch size for every setting in turn, alternated ROUNDS times (default 2), then for each
# setting a one-stream trace at TRACE_BATCH (empty: none) with its kernel-time summary and the
# convolution rates' totals. The traces and summaries go under OUT_DIR as trace-N.json,
# summary-N.txt, rates-N.txt, bandwidth-N.txt (N: the setting's place in the list, from 1).
#   [MODEL=resnet18] [PRECISION=bf16] [BATCHES="128 512"] [ROUNDS=2] [TRACE_BATCH=512] \
#     bench/ab_step.sh BIN_DIR OUT_DIR "VAR=v VAR2=w" "VAR=u" -     ("-": no setting)
# BIN_DIR: build/tools, or a gpu-pack's .gpu/bin. The device ms is bench's fifth column.
set -uo pipefail
bin=$1
out=$2
shift 2
mkdir -p "$out"
here=$(dirname "$0")
model=${MODEL:-resnet18}
precision=${PRECISION:-bf16}
read -r -a batches <<< "${BATCHES:-128 512}"
settings=("$@")
run_with() {  # run_with SETTING COMMAND...: the command with the setting's variables exported
  local setting=$1
  shift
  if [ "$setting" = "-" ]; then "$@"; else env $setting "$@"; fi
}
echo "== $model $precision step at ${batches[*]}: wall median, min, max, -, device ms, peak MiB"
for round in $(seq "${ROUNDS:-2}"); do
  for setting in "${settings[@]}"; do
    echo "$setting (round $round)"
    run_with "$setting" "$bin/bench" --device cuda --model "$model" --precision "$precision" \
      --batch-size "${batches[@]}" --steps 30 2>&1 | grep -E "training step|rror"
  done
done
[ -n "${TRACE_BATCH-512}" ] || exit 0
n=0
for setting in "${settings[@]}"; do
  n=$((n + 1))
  echo "== one stream, batch ${TRACE_BATCH:-512}, $setting"
  run_with "$setting" "$bin/trainer" --model "$model" --device cuda --precision "$precision" \
    --batch-size "${TRACE_BATCH:-512}" --data synthetic --epochs 1 --max-steps 12 --no-progress \
    --streams 1 --trace "$out/trace-$n.json" > /dev/null 2>&1
  python3 "$here/trace_summary.py" "$out/trace-$n.json" > "$out/summary-$n.txt" 2>&1
  head -3 "$out/summary-$n.txt"
  python3 "$here/trace_summary.py" "$out/trace-$n.json" --rates > "$out/rates-$n.txt" 2>&1
  grep -E "^ +conv2d|^convolutions" "$out/rates-$n.txt"
  python3 "$here/trace_summary.py" "$out/trace-$n.json" --bandwidth --top 200 \
    > "$out/bandwidth-$n.txt" 2>&1
  head -1 "$out/bandwidth-$n.txt"
done
