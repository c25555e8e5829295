#!/usr/bin/env bash
# Installs the Debian packages kiln needs to build, test and train (only those missing).
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev libspdlog-dev libfmt-dev doctest-dev libcli11-dev nlohmann-json3-dev zlib1g-dev libstb-dev
  libdnnl-dev  # oneDNN: the CPU's float32 convolutions
  dataset-fashion-mnist fortunes
  python3  # tests/checkpoint_format_test.py (standard library only)
  clang-14 libclang-rt-14-dev
  clang-format-14  # scripts/check-source.sh (CI)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q "${missing[@]}" || { $sudo apt-get update -q && $sudo apt-get install -y -q "${missing[@]}"; }
