#!/usr/bin/env bash
# kiln as a library: installs the build into a temporary prefix, configures and builds
# examples/ (a standalone project) against it with find_package(kiln), and trains its model
# for a few steps: the test accuracy must be clearly above chance (10%).
#   bash tests/install_example_test.sh BUILD_DIR SOURCE_DIR [GENERATOR] [CXX_COMPILER]
# Exit code 77 (skipped) when Fashion-MNIST is not installed.
set -euo pipefail

BUILD=${1:?usage: install_example_test.sh BUILD_DIR SOURCE_DIR [GENERATOR] [CXX_COMPILER]}
SOURCE=${2:?usage: install_example_test.sh BUILD_DIR SOURCE_DIR [GENERATOR] [CXX_COMPILER]}
GENERATOR=${3:-Ninja}
CXX_COMPILER=${4:-c++}
STEPS=${KILN_EXAMPLE_STEPS:-150}
DATA=/usr/share/datasets/fashion-mnist

if [[ ! -f $DATA/train-images-idx3-ubyte.gz ]]; then
  echo "skipped: Fashion-MNIST is not installed at $DATA"
  exit 77
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kiln_install.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

step() { echo "--- $*"; }

step "cmake --install into $TMP/prefix"
cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log" || { cat "$TMP/install.log"; exit 1; }
for f in include/kiln/core/tensor.h include/kiln/graph/nn/module.h include/kiln/train/evaluate.h \
         lib/cmake/kiln/kilnConfig.cmake lib/cmake/kiln/kilnTargets.cmake bin/trainer; do
  [[ -e $TMP/prefix/$f ]] || { echo "FAIL: $f was not installed"; exit 1; }
done

step "configure and build examples/ against the installed package"
# The source tree is not on the include path: a header the package lacks fails the build.
cmake -S "$SOURCE/examples" -B "$TMP/build" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_CXX_COMPILER="$CXX_COMPILER" -DCMAKE_PREFIX_PATH="$TMP/prefix" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
      >"$TMP/configure.log" 2>&1 \
  || { cat "$TMP/configure.log"; exit 1; }
cmake --build "$TMP/build" >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }
[[ -f $TMP/build/compile_commands.json ]] || { echo "FAIL: no compile_commands.json"; exit 1; }
if grep -q -- "-I$SOURCE " "$TMP/build/compile_commands.json"; then
  echo "FAIL: the example was compiled against the source tree"; exit 1
fi

step "train the example's model for $STEPS steps"
# One thread: ctest runs tests side by side, and OpenMP threads that spin-wait for a busy core
# make a step many times slower.
OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$TMP/build/tiny_cnn" --max-steps "$STEPS" | tee "$TMP/run.log"
accuracy=$(sed -n 's/^test accuracy \([0-9.]*\) .*/\1/p' "$TMP/run.log")
[[ -n $accuracy ]] || { echo "FAIL: no test accuracy printed"; exit 1; }
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.5) }' || { echo "FAIL: test accuracy $accuracy is not clearly above chance (0.1)"; exit 1; }
echo "ok: installed, built against the package, trained to test accuracy $accuracy"

step "custom_trainer: the example's model registered in the trainer's command line"
CT="$TMP/build/custom_trainer"
OMP_NUM_THREADS=1 "$CT" --model tiny-cnn --epochs 1 --max-steps "$STEPS" --batch-size 64 --threads 1 \
  --no-progress --checkpoint "$TMP/tiny.safetensors" | tee "$TMP/ct.log"
trained=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' "$TMP/ct.log" | tail -1)
[[ -n $trained ]] || { echo "FAIL: custom_trainer printed no test accuracy"; exit 1; }
awk -v a="$trained" 'BEGIN { exit !(a >= 50) }' || { echo "FAIL: test accuracy $trained% is not clearly above chance"; exit 1; }
OMP_NUM_THREADS=1 "$CT" eval --checkpoint "$TMP/tiny.safetensors" --threads 1 | tee "$TMP/eval.log"
grep -q "test accuracy $trained%" "$TMP/eval.log" || { echo "FAIL: eval of the checkpoint does not give $trained%"; exit 1; }
"$CT" --help >"$TMP/help.txt"  # to a file: grep -q ending the pipe early fails it under pipefail
grep -q "tiny-cnn" "$TMP/help.txt" || { echo "FAIL: --help does not list tiny-cnn"; exit 1; }
OMP_NUM_THREADS=1 "$CT" --model tiny-cnn --epochs 1 --max-steps 5 --batch-size 16 --threads 1 --no-progress \
  --ranks 2 --check-replicas 5 >"$TMP/ranks.log" 2>&1 || { cat "$TMP/ranks.log"; echo "FAIL: --ranks 2 of custom_trainer"; exit 1; }
"$TMP/build/custom_dump" --model tiny-cnn >"$TMP/dump.log" || { echo "FAIL: custom_dump"; exit 1; }
grep -q "== fused kernels ==" "$TMP/dump.log" || { echo "FAIL: custom_dump shows no fused kernels"; exit 1; }
OMP_NUM_THREADS=1 "$TMP/build/custom_bench" --model tiny-cnn --batch-size 16 --steps 3 --ranks 2 >"$TMP/bench.log" 2>&1 ||
  { cat "$TMP/bench.log"; echo "FAIL: custom_bench on 2 ranks"; exit 1; }
grep -q "tiny-cnn step, batch 16 per rank x 2 CPU ranks" "$TMP/bench.log" ||
  { cat "$TMP/bench.log"; echo "FAIL: custom_bench printed no 2-rank row"; exit 1; }
echo "ok: custom_trainer trained tiny-cnn to $trained%, evaluated its checkpoint alike and ran on 2 ranks; custom_dump and custom_bench (2 ranks) took it"
