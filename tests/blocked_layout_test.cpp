// Values stored in oneDNN's blocked layout on the CPU (backends/cpu/blocked_layout.h): a
// residual block (convolutions, batch norm, ReLU, a skip connection, max pooling, sums over
// the channels and over rows) gives the NCHW results, forward and every gradient, with blocked
// values (the fused groups' views over them, fusion/cpu_lanes.h), and the same bits at 1 and
// 3 threads; the layout finds blocked values in it, and none where a value leaves the program.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backends/compile.h"
#include "backends/cpu/blocked_layout.h"
#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/testing/random_graph.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

// x [B, 16, H, W] -> conv 16->32 -> bn -> relu -> conv 32->32 -> bn, + conv 1x1 16->32 of x,
// relu, max pool; beside it the first activation's squares summed over the channels, the
// second's values over each row and the block's output over each image plane (global
// pooling); the loss weights every element of these differently.
Graph residual_block(std::int64_t batch, std::int64_t size) {
  Graph g;
  const Value x = g.input("x", {batch, 16, size, size});
  const Value w1 = g.input("w1", {32, 16, 3, 3}), w2 = g.input("w2", {32, 32, 3, 3});
  const Value skip_w = g.input("skip_w", {32, 16, 1, 1});
  const Value g1 = g.input("g1", {32}), b1 = g.input("b1", {32});
  const Value g2 = g.input("g2", {32}), b2 = g.input("b2", {32});
  const Value h = relu(batch_norm_training(conv2d(x, w1, 1, 1), g1, b1, 1e-5).y);
  const Value y = batch_norm_training(conv2d(h, w2, 1, 1), g2, b2, 1e-5).y;
  const Value sum_out = relu(y + conv2d(x, skip_w));
  const Value out = max_pool2d(sum_out, 2, 2);
  const Value pooled = sum(sum_out, {2, 3});  // keeps the images and channels
  const Value side = sum(h * h, {1});         // keeps the pixels
  const Value rows = sum(y, {3});             // keeps the channels and rows
  const Value loss = sum_all(out * g.input("weights", out.shape())) +
                     sum_all(side * g.input("side_weights", side.shape())) +
                     sum_all(rows * g.input("row_weights", rows.shape())) +
                     sum_all(pooled * g.input("pooled_weights", pooled.shape()));
  g.output("loss", loss);
  g.output("out", out);
  const std::vector<Value> grads = grad(loss, {x, w1, w2, skip_w, g1, b1, g2, b2});
  const char* names[] = {"dx", "dw1", "dw2", "dskip", "dg1", "db1", "dg2", "db2"};
  for (std::size_t i = 0; i < grads.size(); ++i) g.output(names[i], grads[i]);
  return g;
}

Outputs run_with(const Graph& g, const std::vector<Feed>& feeds, bool blocked, int threads,
                 std::int64_t* blocked_values) {
  if (blocked)
    unsetenv("KILN_CPU_BLOCKED");
  else
    setenv("KILN_CPU_BLOCKED", "0", 1);
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto program = compile(g, {});
  if (blocked_values != nullptr) *blocked_values = blocked_layout(program->graph()).count();
  Outputs out = program->run(feeds);
  omp_set_num_threads(before);
  unsetenv("KILN_CPU_BLOCKED");
  return out;
}

// Every element of `got` within float rounding of `want` (the sums' order differs).
void check_close(const Tensor& got, const Tensor& want) {
  const float* a = got.data<float>();
  const float* b = want.data<float>();
  float scale = 0.0f, worst = 0.0f;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    worst = std::max(worst, std::abs(a[i] - b[i]));
  }
  CHECK(worst <= 1e-5f * scale + 1e-6f);
}

TEST_CASE("blocked values on the CPU: the NCHW results, forward and gradients") {
  // Planes of 256, 144 and 49 (a block's pixels in one tile, several or less than one),
  // batches that split blocks of 16 channels between threads; groups over more than 2^16
  // elements (smaller ones are staged and stay NCHW).
  for (const auto& [batch, size] :
       {std::pair<std::int64_t, std::int64_t>{11, 16}, {35, 12}, {48, 7}}) {
    CAPTURE(batch);
    CAPTURE(size);
    const Graph g = residual_block(batch, size);
    const std::vector<Feed> feeds = test::random_feeds(g, 17);
    const Outputs reference = run_with(g, feeds, false, 1, nullptr);
    std::int64_t count = 0;
    const Outputs one = run_with(g, feeds, true, 1, &count);
    CHECK(count > 0);
    const Outputs three = run_with(g, feeds, true, 3, nullptr);
    for (const auto& [name, tensor] : reference) {
      CAPTURE(name);
      check_close(one.at(name), tensor);
      CHECK(std::memcmp(three.at(name).raw(), one.at(name).raw(), tensor.nbytes()) == 0);
    }
  }
}

TEST_CASE("blocked values: random elementwise DAGs over [B, C, H, W] give the NCHW results") {
  // Values passed between fused groups are blocked (lane views, fusion/cpu_lanes.h): random
  // broadcasts (per-channel, per-image, per-pixel values), sums and maxima over each axis
  // inside the DAG, several outputs, and every input's gradient, on shapes whose planes are
  // whole tiles, several tiles or less than one.
  const Shape shapes[] = {Shape{9, 32, 16, 16}, Shape{44, 32, 7, 7}, Shape{3, 16, 40, 37}};
  std::int64_t blocked_total = 0;
  for (std::uint64_t seed = 0; seed < 48; ++seed) {
    CAPTURE(seed);
    const Shape& base = shapes[seed % 3];
    Graph g;
    testing::build_with_gradients(g, 500 + seed, 6 + static_cast<int>(seed % 15), DType::f32,
                                  &base);
    const std::vector<Feed> feeds = test::random_feeds(g, 31 + seed);
    std::int64_t count = 0;
    const Outputs blocked = run_with(g, feeds, true, 2, &count);
    const Outputs nchw = run_with(g, feeds, false, 2, nullptr);
    blocked_total += count;
    for (const auto& [name, tensor] : nchw) {
      CAPTURE(name);
      check_close(blocked.at(name), tensor);
    }
  }
  CHECK(blocked_total > 0);
}

TEST_CASE("blocked values: none that leaves the program or that a kernel cannot take") {
  Graph g;
  const Value x = g.input("x", {2, 16, 8, 8});
  const Value w = g.input("w", {32, 16, 3, 3});
  const Value y = conv2d(x, w, 1, 1);
  g.output("y", y);  // a graph output stays NCHW
  g.output("z", conv2d(relu(y), g.input("w2", {32, 32, 3, 3}), 1, 1));
  auto program = compile(g, {});
  const BlockedLayout layout = blocked_layout(program->graph());
  const Graph& compiled = program->graph();
  for (const auto& [name, ref] : compiled.outputs())
    CHECK(!layout.stored[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)]);
  const Outputs out = program->run(test::random_feeds(g, 3));
  setenv("KILN_CPU_BLOCKED", "0", 1);
  const Outputs nchw = compile(g, {})->run(test::random_feeds(g, 3));
  unsetenv("KILN_CPU_BLOCKED");
  for (const auto& [name, tensor] : nchw)
    CHECK(std::memcmp(out.at(name).raw(), tensor.raw(), tensor.nbytes()) == 0);
}

}  // namespace
}  // namespace kiln
