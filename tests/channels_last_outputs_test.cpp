// Channels-last outputs of fused groups: the pass that folds a transpose to [B, H, W, C] into its
// producer's group (fusion/channels_last_outputs.h), the CPU evaluator's and the generated
// kernel's stores of such an output (fusion/codegen_channels_last.cpp), and the layout pass's dy
// copies that give the GPU's input gradients one to fold.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "backends/compile.h"
#include "fusion/channels_last_outputs.h"
#include "fusion/codegen.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "gpu/kernel_cache.h"
#include "graph/autograd.h"
#include "graph/ops.h"
#include "graph/passes/channels_last.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

namespace kiln {
namespace {

// relu(x * scale + shift) over x [B, C, H, W] (scale and shift per channel), transposed to
// [B, H, W, C] and read by another group; with `keep`, the [B, C, H, W] value is an output too.
Graph scaled_relu_transposed(const Shape& s, DType dtype, bool keep) {
  Graph g;
  const Value x = g.input("x", s, dtype);
  const Value scale = g.input("scale", {1, s[1], 1, 1}, dtype);
  const Value shift = g.input("shift", {1, s[1], 1, 1}, dtype);
  const Value y = relu(x * scale + shift);
  const Value t = transpose(y, kChannelsLast);
  g.output("t", t);
  g.output("t_doubled", t + t);  // a reader of the copy in another group (another shape)
  if (keep) g.output("y", y);
  return g;
}

int count_op(const Graph& g, OpId id) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op->id == id;
  return n;
}

const FusedGroup* group_with_channels_last(const Graph& g) {
  for (const Node& n : g.nodes())
    if (const FusedGroup* group = fused_group_of(n); group && group->any_channels_last())
      return group;
  return nullptr;
}

void check_same_bits(const Outputs& got, const Outputs& want) {
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    const Tensor& other = got.at(name);
    REQUIRE(other.shape() == tensor.shape());
    std::int64_t differ = 0;
    for (std::int64_t i = 0; i < tensor.numel(); ++i) differ += other.at(i) != tensor.at(i);
    CHECK(differ == 0);
  }
}

struct Case {
  Shape shape;
  DType dtype;
};
// Vector tiles (C and H W multiples of 8; two channel tiles; planes of 16 pixels, a tile over
// four images; many tiles, the last partial), and the one-element form (C 20, 5x7; f32).
const Case kCases[] = {{{2, 64, 8, 8}, DType::bf16},  {{1, 72, 4, 4}, DType::bf16},
                       {{5, 128, 6, 8}, DType::bf16}, {{3, 20, 5, 7}, DType::bf16},
                       {{2, 24, 3, 8}, DType::f16},   {{2, 16, 6, 6}, DType::f32}};

}  // namespace

TEST_CASE("a transpose to channels-last folds into its producer's group: the same bits") {
  for (const Case& c : kCases)
    for (bool keep : {false, true}) {
      CAPTURE(c.shape.str());
      CAPTURE(keep);
      const Graph g = scaled_relu_transposed(c.shape, c.dtype, keep);
      const Graph fused = eliminate_dead_code(fuse(g));
      REQUIRE(count_op(fused, OpId::transpose) == 1);
      // The GPU's policy takes 16-bit values whose channels and planes are multiples of 8.
      const bool vectors =
          c.dtype != DType::f32 && c.shape[1] % 8 == 0 && c.shape[2] * c.shape[3] % 8 == 0;
      CHECK(count_op(fold_channels_last_outputs(fused), OpId::transpose) == (vectors ? 0 : 1));
      const Graph folded = fold_channels_last_outputs(fused, nullptr, true);
      CHECK_NOTHROW(verify(folded));
      CHECK(count_op(folded, OpId::transpose) == 0);
      const FusedGroup* group = group_with_channels_last(folded);
      REQUIRE(group != nullptr);
      // The [B, C, H, W] value is stored only where something still reads it.
      CHECK(group->outputs.size() == (keep ? 2u : 1u));
      CHECK(group->output_channels_last(group->outputs.size() - 1));
      const std::vector<Feed> feeds = test::random_feeds(g, 17);
      check_same_bits(test::run_once(folded, feeds), test::run_once(g, feeds));
      // Folded once: nothing left to fold; KILN_CHANNELS_LAST_OUTPUTS=0 folds nothing.
      CHECK(count_op(fold_channels_last_outputs(folded, nullptr, true), OpId::fused) ==
            count_op(folded, OpId::fused));
      setenv("KILN_CHANNELS_LAST_OUTPUTS", "0", 1);
      CHECK(count_op(fold_channels_last_outputs(fused, nullptr, true), OpId::transpose) == 1);
      unsetenv("KILN_CHANNELS_LAST_OUTPUTS");
    }
}

TEST_CASE("a reduction's group or another permutation keeps its transpose") {
  Graph g;
  const Value x = g.input("x", {2, 8, 4, 4}, DType::bf16);
  const Value y = relu(x);
  g.output("sum", sum(y, {0, 2, 3}));  // y's group ends with a reduction
  g.output("t", transpose(y, kChannelsLast));
  g.output("u", transpose(x * x, {0, 1, 3, 2}));  // not channels-last
  const Graph fused = eliminate_dead_code(fuse(g));
  const Graph folded = fold_channels_last_outputs(fused, nullptr, true);
  CHECK(count_op(folded, OpId::transpose) == count_op(fused, OpId::transpose));
  CHECK(group_with_channels_last(folded) == nullptr);
}

TEST_CASE("a dy copy that does not fold is undone: its gradients read the NCHW dy, unmarked") {
  // conv -> relu -> conv -> max pool, a loss of the pool: the layout pass copies each layer's
  // dy for its input and weight gradients. f32 values: the GPU's policy folds none of them, so
  // both copies are undone; every shape folded: relu's mask group makes the first layer's dy,
  // so that copy folds, and the other (made by the pool's gradient, no group) is undone.
  Graph g;
  const Value x = g.input("x", {2, 8, 6, 6});
  const Value w1 = g.input("w1", {8, 8, 3, 3});
  const Value w2 = g.input("w2", {8, 8, 3, 3});
  const Value y = conv2d(relu(conv2d(x, w1, 1, 1)), w2, 1, 1);
  const Value pooled = max_pool2d(y, 2);
  const Value loss = sum_all(pooled * pooled);
  const std::vector<Value> grads = grad(loss, {x, w1, w2});
  g.output("dx", grads[0]);
  g.output("dw1", grads[1]);
  g.output("dw2", grads[2]);
  auto all = [](const Node&, std::span<const TensorType>) { return true; };
  auto none = [](const Node&, std::span<const TensorType>) { return false; };
  const Graph copied = eliminate_dead_code(channels_last_images(g, none, all));
  REQUIRE(count_op(copied, OpId::transpose) == 2);
  const Graph fused = eliminate_dead_code(fuse(copied));
  auto marked = [](const Graph& h) {
    int n = 0;
    for (const Node& node : h.nodes()) n += conv_y_channels_last(node.attrs);
    return n;
  };
  REQUIRE(marked(fused) == 4);  // both layers' input and weight gradients
  const std::vector<Feed> feeds = test::random_feeds(g, 5);
  const Outputs want = test::run_once(g, feeds);
  const Graph policy = fold_channels_last_outputs(fused);
  CHECK_NOTHROW(verify(policy));
  CHECK(count_op(policy, OpId::transpose) == 0);
  CHECK(marked(policy) == 0);
  CHECK(group_with_channels_last(policy) == nullptr);
  check_same_bits(test::run_once(policy, feeds), want);
  const Graph every = fold_channels_last_outputs(fused, nullptr, true);
  CHECK_NOTHROW(verify(every));
  CHECK(count_op(every, OpId::transpose) == 0);
  CHECK(group_with_channels_last(every) != nullptr);
  CHECK(marked(every) == 2);  // the first layer's gradients read the folded copy
  check_same_bits(test::run_once(every, feeds), want);
}

TEST_CASE("golden: a channels-last output tiles through shared memory, 16-byte rows where it can") {
  std::vector<gpu::KernelSource> sources;
  for (const Case& c : kCases) {
    CAPTURE(c.shape.str());
    const Graph folded = fold_channels_last_outputs(
        eliminate_dead_code(fuse(scaled_relu_transposed(c.shape, c.dtype, true))), nullptr, true);
    const FusedGroup* group = group_with_channels_last(folded);
    REQUIRE(group != nullptr);
    const CudaKernelSource k = generate_cuda(*group);
    const std::int64_t tiles =
        (c.shape[0] * c.shape[2] * c.shape[3] + 63) / 64 * ((c.shape[1] + 63) / 64);
    CHECK(k.work_items == tiles * 256);
    CHECK(k.source.find("__shared__ __align__(16)") != std::string::npos);
    // The vector form: 16-bit values, C and H W multiples of 8.
    const bool wide =
        c.dtype != DType::f32 && c.shape[1] % 8 == 0 && c.shape[2] * c.shape[3] % 8 == 0;
    CHECK((k.source.find("*reinterpret_cast<uint4*>(out1 + q * C + ch)") != std::string::npos) ==
          wide);
    CHECK(k.source.find("out1[q * C + ch] = tile1[") != std::string::npos);  // the other form
    sources.push_back({k.name, k.source, {}});
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kiln-channels-last-outputs-" + std::to_string(::getpid()));
  gpu::KernelCache cache(dir);
  const auto compiled = cache.get_or_compile(sources, {.sm = 90});  // NVRTC, no GPU needed
  REQUIRE(compiled.size() == sources.size());
  for (const auto& k : compiled) CHECK(k.cubin.size() > 4);
  std::filesystem::remove_all(dir);
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("GPU: channels-last outputs of fused groups match the CPU") {
  if (!test::have_gpu()) return;
  for (const Case& c : kCases)
    for (bool keep : {false, true}) {
      CAPTURE(c.shape.str());
      CAPTURE(keep);
      const Graph g = scaled_relu_transposed(c.shape, c.dtype, keep);
      const std::vector<Feed> feeds = test::random_feeds(g, 29 + c.shape[1]);
      // As compile() folds it (the vector shapes), and every shape folded: the same f32 math
      // and one rounding on both.
      test::check_gpu_matches_cpu(g, feeds, test::dtype_tolerance(c.dtype));
      const Graph folded = fold_channels_last_outputs(eliminate_dead_code(fuse(g)), nullptr, true);
      REQUIRE(group_with_channels_last(folded) != nullptr);
      test::check_gpu_matches_cpu(folded, feeds, test::dtype_tolerance(c.dtype));
    }
}
#endif

}  // namespace kiln
