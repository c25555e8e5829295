// The GEMM epilogue pass (fusion/gemm_epilogues.h) and matmul_bias: on the CPU against the
// unfused matmul, bias add and ReLU; on the GPU (cuBLASLt's BIAS / RELU_BIAS) against the CPU,
// in f32 and bf16, with transposed operands and sizes that fit no tile.
#include <doctest/doctest.h>

#include "fusion/fuse.h"
#include "fusion/gemm_epilogues.h"
#include "graph/passes/autocast.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

namespace kiln {
namespace {

// y = [relu](x op(w) + bias), x [m, k], w [n, k] when trans_w, else [k, n].
Graph dense_layer(std::int64_t m, std::int64_t k, std::int64_t n, bool trans_w, bool relu_too) {
  Graph g;
  const Value x = g.input("x", {m, k});
  const Value w = g.input("w", trans_w ? Shape{n, k} : Shape{k, n});
  const Value bias = g.input("bias", {n});
  const Value y = matmul(x, w, false, trans_w) + bias;
  g.output("y", relu_too ? relu(y) : y);
  return g;
}

int count(const Graph& g, OpId id) {
  int c = 0;
  for (const Node& n : g.nodes()) c += n.op->id == id;
  return c;
}

}  // namespace

TEST_CASE("a matmul and its bias (and ReLU) group become one matmul_bias equal to the three ops") {
  for (bool trans_w : {false, true})
    for (bool relu_too : {false, true}) {
      CAPTURE(trans_w);
      CAPTURE(relu_too);
      const Graph g = dense_layer(37, 19, 10, trans_w, relu_too);
      const Graph fused = eliminate_dead_code(fuse_gemm_epilogues(fuse(eliminate_dead_code(g))));
      verify(fused);
      CHECK(count(fused, OpId::matmul_bias) == 1);
      CHECK(count(fused, OpId::matmul) == 0);
      CHECK(count(fused, OpId::fused) == 0);
      const std::vector<Feed> feeds = test::random_feeds(g, 7);
      const Outputs want = compile(g, {.fuse = false})->run(feeds);
      const Outputs got = compile(fused, {.fuse = false})->run(feeds);
      CHECK(test::closeness(got.at("y"), want.at("y"), 1e-5, 1e-5) <= 1.0);
    }
}

TEST_CASE("a bias cast to bf16 inside the group becomes a cast node before matmul_bias") {
  // A hidden layer (its bf16 activation feeds the next GEMM) in autocast without weight copies.
  Graph g;
  const Value x = g.input("x", {16, 12});
  const Value hidden = relu(matmul(x, g.input("w", {24, 12}), false, true) + g.input("bias", {24}));
  g.output("y", matmul(hidden, g.input("w2", {24, 5})));
  const Graph low = autocast(eliminate_dead_code(g), DType::bf16);  // casts, no weight copies
  const Graph fused = eliminate_dead_code(fuse_gemm_epilogues(fuse(low)));
  verify(fused);
  CHECK(count(fused, OpId::matmul_bias) == 1);
  for (const Node& n : fused.nodes())
    if (n.op->id == OpId::matmul_bias) {
      const Node& bias = fused.node(n.inputs[2].node);
      CHECK(bias.op->id == OpId::cast);
      CHECK(bias.outputs[0].dtype == DType::bf16);
    }
  const std::vector<Feed> feeds = test::random_feeds(g, 5);
  CHECK(test::closeness(compile(fused, {.fuse = false})->run(feeds).at("y"),
                        compile(low, {.fuse = false})->run(feeds).at("y"), 0.15,
                        0.03) <= 1.0);  // one rounding against two
}

TEST_CASE("a product that is read elsewhere keeps its matmul: no epilogue") {
  Graph g;
  const Value x = g.input("x", {8, 5});
  const Value w = g.input("w", {5, 6});
  const Value p = matmul(x, w);
  g.output("y", relu(p + g.input("bias", {6})));
  g.output("p", p);
  const Graph fused = eliminate_dead_code(fuse_gemm_epilogues(fuse(eliminate_dead_code(g))));
  CHECK(count(fused, OpId::matmul_bias) == 0);
  CHECK(count(fused, OpId::matmul) == 1);
}

TEST_CASE("GPU: matmul_bias through cuBLASLt matches the CPU in f32 and bf16") {
  if (!test::have_gpu()) return;
  for (bool trans_w : {false, true})
    for (bool relu_too : {false, true}) {
      CAPTURE(trans_w);
      CAPTURE(relu_too);
      const Graph g = dense_layer(37, 19, 10, trans_w, relu_too);
      test::check_gpu_matches_cpu(g, test::random_feeds(g, 11), 1e-4);
      const Graph big = dense_layer(64, 300, 128, trans_w, relu_too);
      const std::vector<Feed> feeds = test::random_feeds(big, 13);
      const Outputs cpu = compile(big, {.precision = Precision::bf16})->run(feeds);
      const Outputs gpu =
          compile(big, {.device = Device::cuda(), .precision = Precision::bf16})->run(feeds);
      CHECK(test::closeness(gpu.at("y"), cpu.at("y"), 0.1, 0.02) <= 1.0);
    }
}

}  // namespace kiln
