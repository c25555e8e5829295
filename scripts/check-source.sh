#!/usr/bin/env bash
# Checks the source habits that CI enforces: every C++/CUDA source formatted by .clang-format
# (clang-format 14), and no source file over 500 lines outside tests/ (the size rule:
# DESIGN.md's "small files"). Prints each offender and exits 1 if there is any.
set -euo pipefail
cd "$(dirname "$0")/.."
format=${CLANG_FORMAT:-clang-format-14}
command -v "$format" >/dev/null || { echo "check-source: $format not found" >&2; exit 1; }

mapfile -t sources < <(git ls-files '*.cpp' '*.h' '*.cuh' | grep -v '^fuzz/corpus/')
status=0
for f in "${sources[@]}"; do
  if ! "$format" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "check-source: $f is not formatted (run: $format -i $f)"
    status=1
  fi
  case "$f" in tests/*) continue ;; esac
  lines=$(wc -l <"$f")
  if [ "$lines" -gt 500 ]; then
    echo "check-source: $f has $lines lines (at most 500 outside tests/: split it)"
    status=1
  fi
done
[ $status -eq 0 ] && echo "check-source: ${#sources[@]} files formatted, none over 500 lines"
exit $status
