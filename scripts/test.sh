#!/usr/bin/env bash
# Sets up, builds and runs every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
# Tests run side by side: OpenMP threads that wait passively do not spin on cores other
# tests need (spinning made single tests 20-40x slower on 2 cores).
export OMP_WAIT_POLICY=passive
ctest --test-dir build --output-on-failure -j "$(nproc)"
