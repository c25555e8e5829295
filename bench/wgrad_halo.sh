#!/usr/bin/env bash
# grad_weight's halo form (by default where it pays, KILN_CONV_WGRAD_HALO=1 wherever it fits): its
# GPU test against the CPU, then resnet18's bf16 step by default and with it everywhere (device
# ms, and per pass from a one-stream trace at b512: stage 1's passes are the four 38.655-GFLOP
# grad_weight lines before the stem's), then the zoo's resnet. Session 36 measured stage 1's
# passes 115-118 -> 84-86 us on an H100 (bench/README.md).
#   bench/wgrad_halo.sh BIN_DIR TESTS_DIR OUT_DIR      (a gpu-pack: .gpu/bin .gpu/bin OUT)
set -uo pipefail
bin=$1
tests=$2
out=$3
here=$(dirname "$0")
mkdir -p "$out"
echo "== cuda_kernels_tests: the TMA passes (the halo form asked for, and not), the plans"
timeout 200 "$tests/cuda_kernels_tests" \
  -tc="conv2d: the TMA channels-last passes*,*halo form*,*grad_weight plans*" 2>&1 |
  grep -E "ERROR|values:|logged|test cases|assertions" | tail -40
echo "== backends_tests: ResNet-18's bf16 step on the GPU against the CPU's, with the form"
KILN_CONV_WGRAD_HALO=1 timeout 150 "$tests/backends_tests" -tc="GPU: ResNet-18's bf16 step*" \
  2>&1 | grep -E "ERROR|values:|test cases|assertions" | tail -20
TRACE_BATCH=512 ROUNDS=2 timeout 200 bash "$here/ab_step.sh" "$bin" "$out/ab" - \
  KILN_CONV_WGRAD_HALO=1
for n in 1 2; do
  echo "-- grad_weight passes, setting $n"
  grep -E "grad_weight" "$out/ab/rates-$n.txt"
done
echo "== the zoo's resnet, bf16 b64 b256: default, then KILN_CONV_WGRAD_HALO=1"
timeout 60 "$bin/bench" --device cuda --model resnet --precision bf16 --batch-size 64 256 \
  --steps 30 2>&1 | grep -E "step|rror"
KILN_CONV_WGRAD_HALO=1 timeout 60 "$bin/bench" --device cuda --model resnet --precision bf16 \
  --batch-size 64 256 --steps 30 2>&1 | grep -E "step|rror"
