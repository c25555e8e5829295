#!/usr/bin/env bash
# Times every zoo model's training step with two builds side by side in one run (the same
# machine, interleaved A B A B so drift hits both), for "no slower than before" checks:
#   bash bench/compare_builds.sh OLD_BIN_DIR NEW_BIN_DIR OUT_DIR [DEVICE] [BATCH]
# Prints one line per model: the median device time (CUDA) or wall time (CPU) of each build
# over both rounds, and new / old. JSON of every round is left in OUT_DIR.
set -u
OLD=${1:?usage: compare_builds.sh OLD_BIN NEW_BIN OUT [DEVICE] [BATCH]}
NEW=${2:?usage: compare_builds.sh OLD_BIN NEW_BIN OUT [DEVICE] [BATCH]}
OUT=${3:?usage: compare_builds.sh OLD_BIN NEW_BIN OUT [DEVICE] [BATCH]}
DEVICE=${4:-cuda}
BATCH=${5:-64}
MODELS=${MODELS:-lenet resnet vgg alexnet inception row-lstm char-lstm gan dcgan}
STEPS=${STEPS:-200}
mkdir -p "$OUT"
for model in $MODELS; do
  for round in 1 2; do
    for build in old new; do
      bin=$OLD
      [ "$build" = new ] && bin=$NEW
      "$bin/bench" --device "$DEVICE" --model "$model" --batch-size "$BATCH" --steps "$STEPS" \
        --json "$OUT/$model-$build-$round.json" >"$OUT/$model-$build-$round.txt" 2>&1 ||
        echo "$model $build round $round failed: $(tail -1 "$OUT/$model-$build-$round.txt")"
    done
  done
done
python3 - "$OUT" $MODELS <<'PY'
import json, os, sys, statistics
out, models = sys.argv[1], sys.argv[2:]
def times(model, build):
    got = []
    for r in (1, 2):
        p = os.path.join(out, f"{model}-{build}-{r}.json")
        if not os.path.exists(p): continue
        for row in json.load(open(p)):
            t = row["device_median_ms"] if row["device_median_ms"] > 0 else row["median_ms"]
            got.append(t)
    return got
print(f"{'model':<12} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
for m in models:
    a, b = times(m, "old"), times(m, "new")
    if not a or not b:
        print(f"{m:<12} missing"); continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{m:<12} {ma:9.3f} {mb:9.3f} {mb / ma:8.3f}   (rounds: old {a}, new {b})")
PY
