#!/usr/bin/env bash
# Installs dependencies, then configures and builds kiln (Release) in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
