#!/usr/bin/env bash
# kiln-cache's command line: each subcommand on an empty cache, and bad input (exit codes and the
# one-line errors). What the operations do to a filled cache is tested in gpu_test.cpp.
# $1: the kiln-cache binary.
set -uo pipefail
tool=${1:?usage: kiln_cache_cli_test.sh KILN_CACHE}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "kiln_cache_cli_test: FAILED: $*" >&2; exit 1; }
expect() {  # expect RC TEXT ARGS...: the exit code and a line of the output
  local rc=$1 text=$2
  shift 2
  out=$("$tool" "$@" 2>&1)
  got=$?
  [ "$got" = "$rc" ] || fail "kiln-cache $*: exit $got, expected $rc: $out"
  grep -qF -- "$text" <<<"$out" || fail "kiln-cache $*: no '$text' in: $out"
}
expect 0 "0 entries, 0.0 MiB in $tmp/c" --dir "$tmp/c" list
expect 0 "removed 0 entries" --dir "$tmp/c" trim --max-mib 0
expect 0 "exported 0 entries to $tmp/e.kcache" --dir "$tmp/c" export "$tmp/e.kcache"
expect 0 "imported 0 entries into $tmp/d" --dir "$tmp/d" import "$tmp/e.kcache"
expect 1 "kiln-cache: error: kiln-cache show: no entry has the key prefix or kernel name 'kiln_x'" --dir "$tmp/c" show kiln_x
printf 'junk' > "$tmp/junk"
expect 1 "not a kiln cache archive (it does not start with KILNCACHE1)" --dir "$tmp/c" import "$tmp/junk"
expect 1 "cannot read $tmp/missing" --dir "$tmp/c" import "$tmp/missing"
expect 2 "A subcommand is required" --dir "$tmp/c"
expect 2 "--max-mib is required" --dir "$tmp/c" trim
echo "kiln_cache_cli_test: all scenarios passed"
