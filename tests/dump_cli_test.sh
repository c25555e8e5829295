#!/usr/bin/env bash
# dump's command line: every format, the fusion summary, and bad flags. $1: the dump binary.
set -uo pipefail
dump=${1:?usage: dump_cli_test.sh DUMP [ON|OFF: the build has the CUDA backend]}
have_cuda=${2:-OFF}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "dump_cli_test: FAILED: $*" >&2; exit 1; }

"$dump" --model lenet --stage train > "$tmp/text" || fail "text format exited $?"
grep -q "^ops before: " "$tmp/text" || fail "text has no 'ops before'"
grep -q "^kernels after: " "$tmp/text" || fail "text has no 'kernels after'"
grep -q "^bytes read and written by the kernels: [0-9]* (fused groups [0-9]*, the others [0-9]*)" "$tmp/text" ||
  fail "text has no 'bytes read and written'"
grep -q "== fused kernels ==" "$tmp/text" || fail "text lists no fused kernels"
grep -q "__global__" "$tmp/text" && fail "text without --kernels shows source"

# The hand-written CUDA kernels of each node that is not a fused group, from the op entries alone
# (no GPU needed): resnet18's convolutions over 64+ channels read a channels-last copy in bf16
# and, under TF32, in f32; the 3-channel first convolution runs the direct kernel (on the tensor
# cores in bf16); fp32 stays on the CUDA cores. A build without CUDA lists none.
for p in bf16 tf32 fp32; do
  "$dump" --model resnet18 --batch-size 64 --precision $p --format json -o "$tmp/r18_$p.json" ||
    fail "resnet18 $p json exited $?"
done
python3 - "$tmp" "$have_cuda" <<'PY' || fail "the hand-written kernels are wrong"
import json, sys
tmp, have_cuda = sys.argv[1], sys.argv[2] in ("ON", "1", "TRUE", "true")
def kernels(p, op):
    j = json.load(open(f"{tmp}/r18_{p}.json"))
    return [k for h in j["hand_written_kernels"] if h["op"] == op for k in h["kernels"]]
if not have_cuda:
    assert kernels("bf16", "conv2d") == [], "no CUDA backend, yet kernels are listed"
    sys.exit(0)
bf16 = kernels("bf16", "conv2d")
assert any(k.startswith("kiln_conv_nhwc_fwd_") and k.endswith("_bf16") for k in bf16), bf16
assert "kiln_conv_nchw_to_nhwc_u16" in bf16 and "kiln_conv_direct_mma_bf16_c3_3x3_s1" in bf16
assert "kiln_conv_direct_f32_c3_3x3_s1" in kernels("fp32", "conv2d")
assert any(k.startswith("kiln_conv_nhwc_") for k in kernels("bf16", "conv2d_grad_input"))
# Without a GPU the view is planned for an sm_90 of 132 SMs: the TMA passes, the stride-2 input
# gradient by classes of dx's pixels, and the layout pass's transposes, as on an H100/H200.
r18 = json.load(open(f"{tmp}/r18_bf16.json"))
if "sm_90 of 132 SMs (no GPU here)" in r18["title"]:
    assert any(k.startswith("kiln_conv_nhwc_tma_") for k in bf16), bf16
    assert any("_c4_" in k for k in kernels("bf16", "conv2d_grad_input"))
    assert any(n["op"] == "transpose" for n in r18["before"]), "no channels-last transposes"
tf32 = kernels("tf32", "conv2d")
assert any(k.startswith("kiln_conv_nhwc_fwd_") and k.endswith("_tf32") for k in tf32), tf32
assert not any("nhwc" in k for k in kernels("fp32", "conv2d") + kernels("fp32", "conv2d_grad_input"))
PY

"$dump" --model lenet --kernels > "$tmp/kernels" || fail "--kernels exited $?"
grep -q 'extern "C" __global__ void kiln_' "$tmp/kernels" || fail "--kernels shows no kernel source"

"$dump" --model lenet --format json --kernels -o "$tmp/lenet.json" || fail "json exited $?"
python3 - "$tmp/lenet.json" <<'PY' || fail "json summary is wrong"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["summary"]
assert s["ops_before"] > 0 and s["kernels_after"] > 0, s
assert s["kernels_after"] * 2 < s["ops_before"], s  # fusion at least halves the kernels of the LeNet step
assert s["bytes_saved"] > 0, s
# LeNet's conv1 alone reads its [64, 1, 28, 28] f32 input and writes [64, 32, 28, 28]: 6.6 MB.
assert s["other_bytes"] > 64 * 33 * 28 * 28 * 4 and s["fused_bytes"] > 0, s
assert len(j["kernels"]) == s["fused_kernels"] and all("source" in k for k in j["kernels"]), "kernels"
assert len(j["before"]) > len(j["after"]), "graphs"
# The lowering: every kernel launched once with its stream and buffers, events recorded
# before they are waited for, offsets inside the arena, LeNet's SGD updates all in place.
low = j["lowering"]
kernels = [l for l in low["launches"] if "node" in l]
assert len(kernels) == s["launches"], (len(kernels), s)
# A horizontal launch stands for its member groups (the updates of one kind on one stream).
assert sum(len(l.get("merged", [l["node"]])) for l in kernels) == s["kernels_after"], s
assert any(len(l.get("merged", [])) >= 2 for l in kernels), "no horizontal launch"
streams = {l["stream"] for l in kernels}
assert {0, 1} <= streams <= {0, 1, 2, 3}, ("the critical path and side streams of the default 4", streams)
recorded = set()
for l in kernels:
    assert all(e in recorded for e in l["waits"]), l
    if "records" in l: recorded.add(l["records"])
    for b in l["buffers"]:
        assert "in_place_of" in b or b["offset"] + b["bytes"] <= low["arena_bytes"], b
ups = low["in_place_updates"]
assert ups and all(u["in_place"] for u in ups), ups
assert sum("in_place_of" in b for l in kernels for b in l["buffers"]) == len(ups), "in-place buffers"
assert all(sl["offset"] % 256 == 0 for sl in low["slots"]), "aligned slots"
PY
KILN_DUMP=launch_list,plan_memory "$dump" --model lenet > /dev/null 2> "$tmp/lowering" || fail "KILN_DUMP exited $?"
grep -q "=== lowering after plan_memory ===" "$tmp/lowering" && grep -q "records event 0" "$tmp/lowering" \
  || fail "KILN_DUMP=launch_list,plan_memory printed no lowering"

"$dump" --model lenet --stage forward --format dot > "$tmp/lenet.dot" || fail "dot exited $?"
grep -q "subgraph cluster_" "$tmp/lenet.dot" || fail "dot has no clusters for fused groups"
if command -v dot > /dev/null; then
  dot -Tsvg "$tmp/lenet.dot" -o "$tmp/lenet.svg" || fail "Graphviz cannot render the DOT output"
fi

# GANs: two steps; the discriminator's by default, and only those two stages.
"$dump" --model gan > "$tmp/gan" || fail "gan exited $?"
grep -q "gan discriminator step, batch 64, adam" "$tmp/gan" || fail "gan: no discriminator step by default"
"$dump" --model dcgan --stage generator > "$tmp/dcgan" || fail "dcgan generator exited $?"
grep -q "dcgan generator step" "$tmp/dcgan" && grep -q "conv2d_grad_input" "$tmp/dcgan" || fail "dcgan generator: no transposed convolutions"
"$dump" --model gan --stage train > /dev/null 2> "$tmp/err"; code=$?
[ $code -eq 1 ] && grep -q "gan has the stages discriminator and generator" "$tmp/err" || fail "gan --stage train: exit $code, $(cat "$tmp/err")"

"$dump" --format yaml > /dev/null 2>&1; [ $? -eq 2 ] || fail "--format yaml should exit 2"
"$dump" --bogus > /dev/null 2>&1; [ $? -eq 2 ] || fail "--bogus should exit 2"
"$dump" -o /nonexistent/dir/out.txt > /dev/null 2> "$tmp/err"; code=$?
[ $code -eq 1 ] && grep -q "dump: error: /nonexistent/dir/out.txt" "$tmp/err" || fail "unwritable output: exit $code, $(cat "$tmp/err")"
echo "dump_cli_test: all scenarios passed"
