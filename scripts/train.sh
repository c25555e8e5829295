#!/usr/bin/env bash
# Sets up and trains the default model (LeNet, Fashion-MNIST, 2 epochs). Extra arguments go to trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/tools/trainer --model lenet --epochs 2 "$@"
