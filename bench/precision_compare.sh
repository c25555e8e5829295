#!/usr/bin/env bash
# Times every zoo model's training step in fp32 and in bf16 (or the precisions in
# PRECISIONS) side by side in one run, at each batch size, interleaved per model, and prints
# one line per (model, batch): device ms and peak device MiB of each precision, and the ratios:
#   bash bench/precision_compare.sh BIN_DIR OUT_DIR [BATCH...]
set -u
BIN=${1:?usage: precision_compare.sh BIN_DIR OUT_DIR [BATCH...]}
OUT=${2:?usage: precision_compare.sh BIN_DIR OUT_DIR [BATCH...]}
shift 2
BATCHES=${*:-64 256}
MODELS=${MODELS:-lenet resnet vgg alexnet inception row-lstm char-lstm gan dcgan resnet18}
PRECISIONS=${PRECISIONS:-fp32 bf16}
STEPS=${STEPS:-100}
mkdir -p "$OUT"
for model in $MODELS; do
  for batch in $BATCHES; do
    for p in $PRECISIONS; do
      "$BIN/bench" --device cuda --model "$model" --batch-size "$batch" --steps "$STEPS" \
        --precision "$p" --json "$OUT/$model-$batch-$p.json" >"$OUT/$model-$batch-$p.txt" 2>&1 ||
        echo "$model batch $batch $p failed: $(tail -1 "$OUT/$model-$batch-$p.txt")"
    done
  done
done
python3 - "$OUT" "$PRECISIONS" "$BATCHES" $MODELS <<'PY'
import json, os, sys
out, precisions, batches, models = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4:]
def row(model, batch, p):
    path = os.path.join(out, f"{model}-{batch}-{p}.json")
    if not os.path.exists(path): return None
    r = json.load(open(path))[0]
    return r["device_median_ms"], r.get("peak_device_mib", float("nan"))
head = f"{'model':<10} {'batch':>5}" + "".join(f" {p + ' ms':>10} {p + ' MiB':>10}" for p in precisions)
print(head + "".join(f" {p + '/' + precisions[0] + ' ms':>13} {'MiB':>6}" for p in precisions[1:]))
for m in models:
    for b in batches:
        rows = [row(m, b, p) for p in precisions]
        line = f"{m:<10} {b:>5}"
        for r in rows: line += f" {r[0]:>10.3f} {r[1]:>10.1f}" if r else f" {'-':>10} {'-':>10}"
        for r in rows[1:]:
            line += (f" {r[0] / rows[0][0]:>13.3f} {r[1] / rows[0][1]:>6.2f}"
                     if r and rows[0] else f" {'-':>13} {'-':>6}")
        print(line)
PY
