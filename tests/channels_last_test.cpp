// Channels-last images: conv2d and conv2d_grad_weight reading x stored [B, H, W, C], the layout
// pass that puts them there (graph/passes/channels_last.h), and the GPU's passes that read them.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "backends/compile.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/conv_mma.h"
#endif
#include "graph/autograd.h"
#include "graph/op.h"
#include "graph/ops.h"
#include "graph/passes/channels_last.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

namespace kiln {
namespace {

void check_same_bits(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) differ += a.at(i) != b.at(i);
  CHECK(differ == 0);
}

int count_nodes(const Graph& g, OpId id, bool channels_last_only = false) {
  int count = 0;
  for (const Node& n : g.nodes())
    count += n.op->id == id && (!channels_last_only || (n.attrs.has("channels_last") &&
                                                        n.attrs.integer("channels_last") == 1));
  return count;
}

// Two convolutions of one image x [B, C, H, W] (a 3x3 of C filters, then k x k at stride 2 of
// `filters`) and the gradients of a loss with respect to x and both weights: two conv2d and two
// conv2d_grad_weight read x.
Graph two_convolutions(Shape x_shape = {2, 8, 6, 6}, std::int64_t filters = 4, std::int64_t k = 1) {
  Graph g;
  const Value x = g.input("x", x_shape);
  const std::int64_t c = x_shape[1];
  const Value w1 = g.input("w1", {c, c, 3, 3});
  const Value w2 = g.input("w2", {filters, c, k, k});
  const Value y1 = conv2d(x, w1, 1, 1);
  const Value y2 = conv2d(x, w2, 2, k / 2);
  const Value loss = sum_all(relu(y1) * y1) + sum_all(y2 * y2);
  const std::vector<Value> grads = grad(loss, {x, w1, w2});
  g.output("y1", y1);
  g.output("y2", y2);
  g.output("dx", grads[0]);
  g.output("dw1", grads[1]);
  g.output("dw2", grads[2]);
  return g;
}

}  // namespace

TEST_CASE("a channels-last conv2d, its gradients and theirs give the NCHW ones' bits (CPU)") {
  for (auto [stride, padding] : {std::pair{1, 1}, std::pair{2, 0}}) {
    CAPTURE(stride);
    Outputs results[2];
    for (bool last : {false, true}) {
      Graph g;
      const Value x = g.input("x", {3, 5, 7, 6});
      const Value w = g.input("w", {4, 5, 3, 3});
      const Value image = last ? transpose(x, kChannelsLast) : x;
      const Value y = conv2d(image, w, stride, padding, last);
      const std::vector<Value> first = grad(sum_all(y * y), {x, w});
      // d(sum dw^2)/dx: the gradient of conv2d_grad_weight, which reads the image too.
      const std::vector<Value> second = grad(sum_all(first[1] * first[1]), {x});
      g.output("y", y);
      g.output("dx", first[0]);
      g.output("dw", first[1]);
      g.output("ddx", second[0]);
      CHECK(count_nodes(g, OpId::conv2d_grad_weight, true) == (last ? 1 : 0));
      results[last] = test::run_once(g, test::random_feeds(g, 40 + stride));
    }
    for (const char* name : {"y", "dx", "dw", "ddx"}) {
      CAPTURE(name);
      check_same_bits(results[1].at(name), results[0].at(name));
    }
  }
}

TEST_CASE("a channels-last image must be [B, H, W, C] and its channels match the filters") {
  Graph g;
  const Value x = g.input("x", {2, 6, 6, 5});  // 5 channels, stored last
  CHECK_THROWS_WITH_AS(conv2d(x, g.input("w", {4, 6, 3, 3}), 1, 1, true),
                       doctest::Contains("input has 5 channels"), Error);
  CHECK_THROWS_WITH_AS(conv2d(g.input("v", {2, 6, 5}), g.input("u", {4, 5, 3, 3}), 1, 1, true),
                       doctest::Contains("[B, H, W, C]"), Error);
}

TEST_CASE("the layout pass transposes each picked image once and changes no result") {
  const Graph g = two_convolutions();
  const std::vector<Feed> feeds = test::random_feeds(g, 7);
  const Outputs want = test::run_once(g, feeds);
  struct Case {
    const char* name;
    ChannelsLastWanted wants;
    int transposes, marked_forward, marked_weight;
  };
  const Case cases[] = {
      {"every convolution", [](const Node&, std::span<const TensorType>) { return true; }, 1, 2, 2},
      {"the stride-1 forward only",
       [](const Node& n, std::span<const TensorType>) {
         return n.op->id == OpId::conv2d && n.attrs.integer("stride") == 1;
       },
       1, 1, 0},
      {"none", [](const Node&, std::span<const TensorType>) { return false; }, 0, 0, 0}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Graph after = channels_last_images(g, c.wants);
    CHECK_NOTHROW(verify(after));
    CHECK(count_nodes(after, OpId::transpose) - count_nodes(g, OpId::transpose) == c.transposes);
    CHECK(count_nodes(after, OpId::conv2d, true) == c.marked_forward);
    CHECK(count_nodes(after, OpId::conv2d_grad_weight, true) == c.marked_weight);
    const Outputs got = test::run_once(after, feeds);
    for (const auto& [name, tensor] : want) {
      CAPTURE(name);
      check_same_bits(got.at(name), tensor);
    }
    // Running the pass again finds nothing left to do.
    CHECK(count_nodes(channels_last_images(after, c.wants), OpId::transpose) ==
          count_nodes(after, OpId::transpose));
  }
}

TEST_CASE("the layout pass copies a dy once, for its input gradient and the weight gradient") {
  const Graph g = two_convolutions();
  const std::vector<Feed> feeds = test::random_feeds(g, 9);
  const Outputs want = test::run_once(g, feeds);
  auto marked = [](const Graph& h, OpId id) {
    int count = 0;
    for (const Node& n : h.nodes()) count += n.op->id == id && conv_y_channels_last(n.attrs);
    return count;
  };
  auto none = [](const Node&, std::span<const TensorType>) { return false; };
  struct Case {
    const char* name;
    ChannelsLastWanted wants_dy;
    int copies, marked_input, marked_weight;
  };
  const Case cases[] = {
      {"every gradient", [](const Node&, std::span<const TensorType>) { return true; }, 2, 2, 2},
      {"the input gradients only",
       [](const Node& n, std::span<const TensorType>) {
         return n.op->id == OpId::conv2d_grad_input;
       },
       2, 2, 0},
      // A weight gradient alone makes no copy: none exists for it to share.
      {"the weight gradients only",
       [](const Node& n, std::span<const TensorType>) {
         return n.op->id == OpId::conv2d_grad_weight;
       },
       0, 0, 0},
      {"the stride-1 layer's",
       [](const Node& n, std::span<const TensorType>) { return n.attrs.integer("stride") == 1; }, 1,
       1, 1}};
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const Graph after = channels_last_images(g, none, c.wants_dy);
    CHECK_NOTHROW(verify(after));
    CHECK(count_nodes(after, OpId::transpose) - count_nodes(g, OpId::transpose) == c.copies);
    CHECK(marked(after, OpId::conv2d_grad_input) == c.marked_input);
    CHECK(marked(after, OpId::conv2d_grad_weight) == c.marked_weight);
    const Outputs got = test::run_once(after, feeds);
    for (const auto& [name, tensor] : want) {
      CAPTURE(name);
      check_same_bits(got.at(name), tensor);
    }
    CHECK(count_nodes(channels_last_images(after, none, c.wants_dy), OpId::transpose) ==
          count_nodes(after, OpId::transpose));
  }
}

TEST_CASE("the GPU's layout choice on a bf16 step changes no CPU result (no GPU needed)") {
  // apply_channels_last asks the CUDA backend which passes read NHWC; without a GPU its
  // channels-last forward passes still qualify (no sm_90 query), so the pass runs here too.
  const Graph g = apply_precision(two_convolutions({16, 64, 16, 16}, 128, 3), Precision::bf16);
  const Graph picked = apply_channels_last(g);
  CHECK_NOTHROW(verify(picked));
#ifdef KILN_HAVE_CUDA
  CHECK(count_nodes(picked, OpId::conv2d, true) == 2);
#endif
  const std::vector<Feed> feeds = test::random_feeds(g, 23);
  const Outputs want = test::run_once(g, feeds), got = test::run_once(picked, feeds);
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    check_same_bits(got.at(name), tensor);
  }
  setenv("KILN_CHANNELS_LAST", "0", 1);
  CHECK(count_nodes(apply_channels_last(g), OpId::transpose) == count_nodes(g, OpId::transpose));
  unsetenv("KILN_CHANNELS_LAST");
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("GPU: channels-last images give the NCHW passes' bits and match the CPU") {
  if (!test::have_gpu()) return;
  // bf16 through autocast, 64 channels at 16x16 into 64 and (stride 2) 128 filters, sizes for
  // the tensor cores (the TMA passes on sm_90, the channels-last mma.sync passes elsewhere), and
  // an f32 graph with an image marked channels-last by hand, whose passes read NCHW (transposed
  // back in the workspace).
  const Graph g = two_convolutions({32, 64, 16, 16}, 128, 3);
  const std::vector<Feed> feeds = test::random_feeds(g, 11);
  const Graph low = apply_precision(g, Precision::bf16);
  const Graph picked = apply_channels_last(low);
  CHECK(count_nodes(picked, OpId::conv2d, true) == 2);
  if (cuda::conv_wgmma_enabled(DType::bf16))  // grad_weight's TMA pass reads x channels-last
    CHECK(count_nodes(picked, OpId::conv2d_grad_weight, true) == 2);
  const CompileOptions options{.device = Device::cuda(), .precision = Precision::bf16};
  const Outputs with = compile(g, options)->run(feeds);
  setenv("KILN_CHANNELS_LAST", "0", 1);
  const Outputs without = compile(g, options)->run(feeds);
  unsetenv("KILN_CHANNELS_LAST");
  const Outputs cpu = compile(g, {.precision = Precision::bf16})->run(feeds);
  for (const auto& [name, tensor] : without) {
    CAPTURE(name);
    check_same_bits(with.at(name), tensor);
    double worst = 0, scale = 1e-3;  // bf16 rounding, relative to the tensor's largest value
    for (std::int64_t i = 0; i < tensor.numel(); ++i) {
      worst = std::max(worst, std::abs(with.at(name).at(i) - cpu.at(name).at(i)));
      scale = std::max(scale, std::abs(cpu.at(name).at(i)));
    }
    CHECK(worst / scale < 2e-2);
  }

  Graph marked;
  const Value x = marked.input("x", {2, 7, 5, 6});  // [B, H, W, C]
  const Value w = marked.input("w", {8, 6, 3, 3});
  const Value y = conv2d(x, w, 1, 1, true);
  const std::vector<Value> grads = grad(sum_all(y * y), {x, w});
  marked.output("y", y);
  marked.output("dx", grads[0]);
  marked.output("dw", grads[1]);
  test::check_gpu_matches_cpu(marked, test::random_feeds(marked, 5), 1e-4);
}
#endif

}  // namespace kiln
