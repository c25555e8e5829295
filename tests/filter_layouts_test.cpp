// Convolution filters laid out by nodes of their own (graph/ops.h, conv_filter_layout; the pass
// graph/passes/filter_layouts.h): the layout's elements against its definition, the marked
// convolutions against the plain ones on the CPU (the same bits), the pass's choices for
// ResNet-18's bf16 step as the GPU's passes make them, and on a GPU the same bits as the passes
// that copy their filters themselves.
#include <doctest/doctest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "backends/compile.h"
#ifdef KILN_HAVE_CUDA
#include "backends/cuda/conv.h"
#include "gpu/cuda_runtime.h"
#endif
#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/op.h"
#include "graph/optim.h"
#include "graph/ops.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/filter_layouts.h"
#include "graph/passes/verify.h"
#include "models/resnet.h"
#include "tests/support.h"

namespace kiln {
namespace {

int count_laid_out(const Graph& g, OpId id) {
  int count = 0;
  for (const Node& n : g.nodes())
    count += n.op->id == id && conv_filter_layout_of(n.attrs) != FilterLayout::nchw;
  return count;
}

// A mixed-up order of n taps (a fixed one, so that a wrong inverse cannot pass by symmetry).
std::vector<std::int64_t> shuffled_taps(std::int64_t n) {
  std::vector<std::int64_t> taps;
  for (std::int64_t i = 0; i < n; ++i) taps.push_back((i * 5 + 2) % n);
  return taps;
}

// Every forward in filters-major order as stored, every input gradient channels-major in a
// shuffled order: any order must give the plain convolution's values.
std::optional<FilterOrder> every_filter(const Node& n, std::span<const TensorType> in) {
  const Shape& w = in[1].shape;
  if (n.op->id == OpId::conv2d) {
    std::vector<std::int64_t> taps;
    for (std::int64_t t = 0; t < w[2] * w[3]; ++t) taps.push_back(t);
    return FilterOrder{FilterLayout::filters_major, taps};
  }
  return FilterOrder{FilterLayout::channels_major, shuffled_taps(w[2] * w[3])};
}

}  // namespace

TEST_CASE("conv_filter_layout puts each element of its filters where its definition says") {
  // Two filters of one size (3 x 2 taps) in one node, each laid out on its own.
  const Tensor w = test::random_tensor({3, 5, 2, 3}, DType::f32, 7);
  const Tensor v = test::random_tensor({4, 2, 2, 3}, DType::f32, 8);
  const std::vector<std::int64_t> taps = shuffled_taps(6);
  for (FilterLayout layout : {FilterLayout::filters_major, FilterLayout::channels_major}) {
    const bool filters = layout == FilterLayout::filters_major;
    Graph g;
    const std::vector<Value> laid =
        conv_filter_layout({g.input("w", w.shape()), g.input("v", v.shape())}, layout, taps);
    REQUIRE(laid.size() == 2);
    CHECK(laid[0].shape() == (filters ? Shape{3, 2, 3, 5} : Shape{5, 2, 3, 3}));
    CHECK(laid[1].shape() == (filters ? Shape{4, 2, 3, 2} : Shape{2, 2, 3, 4}));
    g.output("a", laid[0]);
    g.output("b", laid[1]);
    const Outputs out = test::run_once(g, {{"w", w}, {"v", v}});
    for (const auto& [name, filter] : {std::pair{"a", w}, std::pair{"b", v}}) {
      CAPTURE(name);
      const Tensor& a = out.at(name);
      const std::int64_t cout = filter.shape()[0], cin = filter.shape()[1];
      std::int64_t wrong = 0;
      for (std::int64_t o = 0; o < cout; ++o)
        for (std::int64_t c = 0; c < cin; ++c)
          for (std::int64_t t = 0; t < 6; ++t) {
            const std::int64_t source = (o * cin + c) * 6 + taps[static_cast<std::size_t>(t)];
            const std::int64_t at = filters ? (o * 6 + t) * cin + c : (c * 6 + t) * cout + o;
            wrong += a.at(at) != filter.at(source);
          }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("a filter layout's taps must order every tap once") {
  Graph g;
  const Value w = g.input("w", {4, 2, 3, 3});
  const std::vector<std::int64_t> nine = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  CHECK_THROWS_WITH_AS(conv_filter_layout({w}, FilterLayout::filters_major, {0, 1, 2}),
                       doctest::Contains("are not an order of the filter's 9 taps"), Error);
  CHECK_THROWS_WITH_AS(
      conv_filter_layout({w}, FilterLayout::channels_major, {0, 1, 2, 3, 4, 5, 6, 7, 7}),
      doctest::Contains("are not an order"), Error);
  CHECK_THROWS_WITH_AS(
      conv_filter_layout({w, g.input("v", {4, 2, 1, 1})}, FilterLayout::filters_major, nine),
      doctest::Contains("is not [Cout, Cin, KH, KW] of the first's size"), Error);
  // The pass runs after autograd: a gradient through a marked convolution is refused.
  const Value x = g.input("x", {1, 2, 5, 5});
  g.output("y", conv2d(x, w, 1, 1));
  Graph laid = lay_out_filters(g, every_filter);
  const Value y = laid.value(laid.output_ref("y"));
  REQUIRE(conv_filter_layout_of(laid.node(y.ref().node).attrs) == FilterLayout::filters_major);
  CHECK_THROWS_WITH_AS(grad(sum(y, {0, 1, 2, 3}), {laid.value(laid.node(y.ref().node).inputs[0])}),
                       doctest::Contains("no gradient through a laid-out filter"), Error);
}

TEST_CASE("convolutions reading laid-out filters give the plain ones' bits on the CPU") {
  // Odd channels and sizes, strides 1 and 2, one filter read by two forwards and an input
  // gradient: one layout node a (filter, layout, order).
  Graph g;
  const Value x = g.input("x", {2, 5, 9, 7});
  const Value w = g.input("w", {6, 5, 3, 3});
  const Value dy = g.input("dy", {2, 6, 5, 4});
  const Value w1 = g.input("w1", {6, 5, 1, 1});
  g.output("y", conv2d(x, w, 1, 1));
  g.output("y2", conv2d(relu(x), w, 2, 1));
  g.output("dx", conv2d_grad_input(dy, w, x.shape(), 2, 1));
  g.output("dx1", conv2d_grad_input(dy, w1, x.shape(), 2, 0));
  const Graph laid = lay_out_filters(g, every_filter);
  CHECK_NOTHROW(verify(laid));
  CHECK(test::count_nodes(laid, OpId::conv_filter_layout) == 3);
  CHECK(count_laid_out(laid, OpId::conv2d) == 2);
  CHECK(count_laid_out(laid, OpId::conv2d_grad_input) == 2);
  const std::vector<Feed> feeds = test::random_feeds(g, 11);
  const Outputs want = test::run_once(g, feeds), got = test::run_once(laid, feeds);
  for (const char* name : {"y", "y2", "dx", "dx1"}) {
    CAPTURE(name);
    test::check_same_bits(got.at(name), want.at(name));
  }
  // Nothing wanted: the graph as it was.
  const Graph none = lay_out_filters(
      g, [](const Node&, std::span<const TensorType>) { return std::optional<FilterOrder>(); });
  CHECK(test::count_nodes(none, OpId::conv_filter_layout) == 0);
}

#ifdef KILN_HAVE_CUDA
TEST_CASE("filter layouts as the GPU's passes take them: ResNet-18's bf16 step (no GPU needed)") {
  // Planned without a GPU as `dump` plans, for an sm_90 of 132 SMs (ctest runs each case alone).
  if (gpu::cuda_device_count() == 0) gpu::assume_plan_target(90, 132);
  const kernels::ConvGeometry stage1 =
      kernels::conv_geometry(Shape{32, 64, 32, 32}, Shape{64, 64, 3, 3}, 1, 1);
  if (!cuda::conv_copied_filter_taps(stage1, DType::bf16, cuda::ConvPass::forward)) {
    MESSAGE("skipped: this process chose its passes before the target was assumed");
    return;
  }
  Philox rng(5);
  ResNet18 model(rng);
  Graph step;
  test::add_classifier_step(step, model, {32, 3, 32, 32});
  const Graph g = eliminate_dead_code(apply_precision(step, Precision::bf16));
  const Graph laid = eliminate_dead_code(lay_out_filters(g, cuda::conv_node_filter_order));
  CHECK_NOTHROW(verify(laid));
  // Every convolution but the stem (the direct kernel reads its 3-channel filter as stored)
  // copies its filter for the forward, and every input gradient (19: the stem has none) for
  // its own: 19 layouts each way, each read by one node.
  CHECK(count_laid_out(laid, OpId::conv2d) == 19);
  CHECK(count_laid_out(laid, OpId::conv2d_grad_input) == 19);
  CHECK(test::count_nodes(laid, OpId::conv_filter_layout) == 38);
  // Each layout comes right after the node that makes its filter: here the weight's cast (no
  // optimizer, so no copies); in a training step the weight's copy, where its layer reads it.
  auto check_placement = [](const Graph& laid_step) {
    int layouts = 0;
    for (std::int32_t id = 0; id < static_cast<std::int32_t>(laid_step.nodes().size()); ++id) {
      const Node& n = laid_step.node(id);
      if (n.op->id != OpId::conv_filter_layout) continue;
      ++layouts;
      CHECK(n.outputs.size() == 1);
      const Node& before = laid_step.node(id - 1);
      CHECK((n.inputs[0].node == id - 1 ||
             (before.op->id == OpId::conv_filter_layout && before.inputs[0] == n.inputs[0])));
    }
    CHECK(layouts == 38);
  };
  check_placement(laid);
  {
    Philox step_rng(6);
    ResNet18 trained(step_rng);
    Graph with_sgd;
    const Value loss = cross_entropy(trained(with_sgd.input("x", {32, 3, 32, 32})),
                                     with_sgd.input("labels", {32}, DType::i64));
    std::vector<Value> params;
    for (const VariablePtr& p : trained.parameters()) params.push_back(with_sgd.variable(p));
    with_sgd.output("loss", loss);
    Sgd({.lr = 0.1, .momentum = 0.9})
        .append_update(with_sgd, trained.parameters(), grad(loss, params));
    const Graph copies = eliminate_dead_code(apply_precision(with_sgd, Precision::bf16));
    const Graph laid_copies = lay_out_filters(copies, cuda::conv_node_filter_order);
    CHECK_NOTHROW(verify(laid_copies));
    check_placement(laid_copies);
  }
  setenv("KILN_FILTER_LAYOUTS", "0", 1);
  CHECK(test::count_nodes(lay_out_filters(g, cuda::conv_node_filter_order),
                          OpId::conv_filter_layout) == 0);
  unsetenv("KILN_FILTER_LAYOUTS");
  // On the CPU the laid-out step computes the plain step's bits.
  Philox small_rng(5);
  ResNet18 small_model(small_rng);
  Graph small;
  test::add_classifier_step(small, small_model, {2, 3, 8, 8});
  const Graph plain = eliminate_dead_code(apply_precision(small, Precision::bf16));
  const Graph small_laid = lay_out_filters(plain, every_filter);
  const std::vector<Feed> feeds = test::random_feeds(plain, 47);
  const auto want = test::run_and_restore(plain, feeds);
  const auto got = test::run_and_restore(small_laid, feeds);
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    test::check_same_bits(got.at(name), tensor);
  }
}

TEST_CASE("GPU: convolutions reading laid-out filters give the bits of the passes that copy them") {
  if (!test::have_gpu()) return;
  // The TMA passes' layers (the input gradient by classes: its filter in the classes' order).
  constexpr std::int64_t batch = 128;
  for (const test::ConvLayer l : test::tma_conv_layers()) {
    CAPTURE(l);
    const Shape x_shape{batch, l.channels, 16, 16};
    const std::int64_t out = l.out(16);
    Graph g;
    const Value x = g.input("x", x_shape, DType::bf16);
    const Value w = g.input("w", {l.filters, l.channels, l.kernel, l.kernel}, DType::bf16);
    const Value dy = g.input("dy", {batch, l.filters, out, out}, DType::bf16);
    g.output("y", conv2d(x, w, l.stride, l.padding));
    g.output("dx", conv2d_grad_input(dy, w, x_shape, l.stride, l.padding));
    const Graph laid = lay_out_filters(g, cuda::conv_node_filter_order);
    REQUIRE(test::count_nodes(laid, OpId::conv_filter_layout) == 2);
    const std::vector<Feed> feeds = test::random_feeds(g, 41);
    const Outputs on = compile(g, {.device = Device::cuda()})->run(feeds);
    setenv("KILN_FILTER_LAYOUTS", "0", 1);
    const Outputs off = compile(g, {.device = Device::cuda()})->run(feeds);
    unsetenv("KILN_FILTER_LAYOUTS");
    test::check_same_bits(on.at("y"), off.at("y"));
    test::check_same_bits(on.at("dx"), off.at("dx"));
    const Outputs cpu = test::run_once(g, feeds);
    CHECK(test::closeness(on.at("y"), cpu.at("y"), 4.0 / 256, 4.0 / 256) <= 1.0);
    CHECK(test::closeness(on.at("dx"), cpu.at("dx"), 4.0 / 256, 4.0 / 256) <= 1.0);
  }
}

TEST_CASE("GPU: one launch lays out many filters as the CPU does") {
  if (!test::have_gpu()) return;
  // 28 filters of 3 x 3 (more than one launch's table holds), of every row and column count.
  for (FilterLayout layout : {FilterLayout::filters_major, FilterLayout::channels_major}) {
    Graph g;
    std::vector<Value> filters;
    for (std::int64_t i = 0; i < 28; ++i)
      filters.push_back(g.input("w" + std::to_string(i),
                                {i < 2 ? 64 * (i + 1) : 3 + i, i < 2 ? 64 : 5 + 2 * i, 3, 3},
                                DType::bf16));
    const std::vector<Value> laid = conv_filter_layout(filters, layout, shuffled_taps(9));
    for (std::size_t i = 0; i < laid.size(); ++i) g.output("a" + std::to_string(i), laid[i]);
    const std::vector<Feed> feeds = test::random_feeds(g, 23);
    const Outputs gpu = compile(g, {.device = Device::cuda()})->run(feeds);
    const Outputs cpu = test::run_once(g, feeds);
    for (const auto& [name, tensor] : cpu) {
      CAPTURE(name);
      test::check_same_bits(gpu.at(name), tensor);
    }
  }
}
#endif

}  // namespace kiln
