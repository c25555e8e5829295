#!/usr/bin/env bash
# Times every ResNet-18 convolution pass under each channels-last tile setting (KILN_NHWC_TILE,
# "bm,bn,wm,wn,pieces,stages[,splits]"; "default" is conv_nhwc_plan's choice), one stream so that
# each pass runs alone: the measurement behind conv_nhwc_plan (bench/README.md).
#   bench/conv_tiles.sh [BIN_DIR] [PRECISION] [BATCH] [SETTING...]
set -euo pipefail
bin=${1:-build/tools}
precision=${2:-bf16}
batch=${3:-128}
shift $(($# < 3 ? $# : 3))
settings=("$@")
[ ${#settings[@]} -gt 0 ] || settings=(default 128,64,2,2,8,3 64,128,2,2,8,3 64,64,2,2,8,4
  128,128,2,4,8,3 128,128,2,4,4,4 64,64,2,2,4,3 64,64,2,2,8,4,2)
trace=$(mktemp --suffix .json)
trap 'rm -f "$trace"' EXIT
for setting in "${settings[@]}"; do
  echo "== $setting"
  if [ "$setting" = default ]; then unset KILN_NHWC_TILE; else export KILN_NHWC_TILE=$setting; fi
  "$bin/trainer" --model resnet18 --data synthetic:3x32x32 --device cuda --precision "$precision" \
    --batch-size "$batch" --max-steps 12 --streams 1 --trace "$trace" > /dev/null
  python3 "$(dirname "$0")/trace_summary.py" "$trace" --passes
done
