#!/usr/bin/env bash
# Checks main on a GPU in a few minutes: the warm-up race (backends/device_warm_up.h) in
# RACES fresh processes (default 8), lenet's start-up phases, then the GPU cases of every suite
# that has them, each bounded in time so that a hung suite cannot take the call with it.
#   [RACES=N] bench/gpu_check.sh [BIN_DIR]   (BIN_DIR: build/tools, or a gpu-pack's .gpu/bin)
set -uo pipefail
bin=${1:-build/tools}
tests=$(dirname "$bin")/tests  # the build tree's; a gpu-pack keeps them beside the tools
[ -x "$bin/backends_tests" ] && tests=$bin
echo "== the warm-up race, ${RACES:-8} processes"
pass=0
for _ in $(seq "${RACES:-8}"); do
  "$tests/backends_tests" -tc="*DeviceWarmUp*" 2>&1 | grep -q "1 passed" && pass=$((pass + 1))
done
echo "passed $pass of ${RACES:-8}"
echo "== lenet's start-up"
"$bin/bench" --device cuda --model lenet --startup 2>&1 | tail -8
echo "== the suites' GPU cases"
timeout 180 "$tests/cuda_kernels_tests" 2>&1 | grep -E "ERROR|test cases|assertions" | head -20
timeout 120 "$tests/fusion_tests" -tc="GPU*" 2>&1 | grep -E "ERROR|test cases|assertions" | head -10
timeout 60 "$tests/gpu_tests" 2>&1 | grep -E "ERROR|test cases|assertions" | head -10
timeout 150 "$tests/backends_tests" -tc="GPU*" 2>&1 | grep -E "ERROR|test cases|assertions" | head -10
