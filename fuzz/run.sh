#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang-14 (ASan + UBSan) in their own CMake build, runs
# each over its regression inputs, then fuzzes it from its seed corpus and prints how many
# executions ran. Exits 77 (a skip for ctest) where clang-14 or libFuzzer is missing.
#
#   fuzz/run.sh [--runs N | --time SECONDS] [--jobs J] [--only NAME] [--build-dir DIR]
#
# --runs N      executions per job (default 20000); --time SECONDS instead fuzzes for that long
# --jobs J      parallel fuzzing processes per harness (default 1); executions add up over jobs
# --only NAME   only this harness: safetensors, idx, config or checkpoint_metadata
# --build-dir   where the build, the working corpus and crash artifacts go (default build-fuzz/)
# Crashes are written to <build-dir>/artifacts/<name>/; add each to fuzz/regressions/<name>/.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
runs=20000
seconds=""
jobs=1
only=""
build="$root/build-fuzz"

while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    --time) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    *) echo "fuzz/run.sh: unknown argument '$1' (see the comment at the top of the script)" >&2; exit 2 ;;
  esac
done
case "$only" in ""|safetensors|idx|config|checkpoint_metadata) ;; *) echo "fuzz/run.sh: --only takes safetensors, idx, config or checkpoint_metadata, not '$only'" >&2; exit 2 ;; esac

for tool in clang++-14 clang-14 cmake; do
  command -v "$tool" >/dev/null || { echo "fuzz/run.sh: $tool not found (apt-get install clang-14 libclang-rt-14-dev cmake); skipping" >&2; exit 77; }
done
runtime="$(clang-14 -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a"
[ -f "$runtime" ] || { echo "fuzz/run.sh: $runtime not found (apt-get install libclang-rt-14-dev); skipping" >&2; exit 77; }

mkdir -p "$build"
build="$(cd "$build" && pwd)"
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$here" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" ||
    { cat "$build/configure.log" >&2; exit 1; }
fi
cmake --build "$build" >"$build/build.log" 2>&1 || { cat "$build/build.log" >&2; exit 1; }

status=0
for name in safetensors idx config checkpoint_metadata; do
  [ -z "$only" ] || [ "$only" = "$name" ] || continue
  binary="$build/${name}_fuzzer"
  work="$build/work/$name"
  artifacts="$build/artifacts/$name"
  mkdir -p "$work/corpus" "$artifacts"
  rm -f "$work"/fuzz-*.log

  # Every input that once crashed must now pass.
  regressions=("$here/regressions/$name"/*)
  if [ -e "${regressions[0]}" ]; then
    "$binary" "${regressions[@]}" >"$work/regressions.log" 2>&1 ||
      { cat "$work/regressions.log" >&2; echo "fuzz/run.sh: $name: a regression input fails" >&2; status=1; continue; }
    echo "$name: ${#regressions[@]} regression inputs pass"
  fi

  flags=(-artifact_prefix="$artifacts/" -timeout=10 -print_final_stats=1)
  [ -f "$here/$name.dict" ] && flags+=(-dict="$here/$name.dict")
  # The JSON readers see inputs long enough to nest 200,000 deep (the config reader's 1 MiB
  # bound); the binary loaders keep libFuzzer's default length.
  case "$name" in config|checkpoint_metadata) flags+=(-max_len=600000) ;; esac
  if [ -n "$seconds" ]; then flags+=(-max_total_time="$seconds"); else flags+=(-runs="$runs"); fi
  [ "$jobs" -gt 1 ] && flags+=(-jobs="$jobs" -workers="$jobs")
  start=$(date +%s)
  (cd "$work" && "$binary" "${flags[@]}" corpus "$here/corpus/$name" >"$work/fuzz.log" 2>&1) || {
    cat "$work/fuzz.log" "$work"/fuzz-*.log 2>/dev/null | tail -n 60 >&2
    echo "fuzz/run.sh: $name: the fuzzer found a crash; its input is in $artifacts/" >&2
    status=1
    continue
  }
  logs=("$work/fuzz.log")
  [ "$jobs" -gt 1 ] && logs=("$work"/fuzz-*.log)
  executions=$(cat "${logs[@]}" | sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' | awk '{s += $1} END {print s + 0}')
  echo "$name: $executions executions in $(( $(date +%s) - start )) s over $jobs job(s), no crash" \
       "(corpus: $(ls "$work/corpus" | wc -l) inputs)"
done
exit $status
