// The recompute pass (fusion/recompute.h) and batch norm's one-pass statistics: which values
// fused groups still store, the values against the unfused ops on fresh random inputs, and
// the variance's precision where the mean is large against the spread.
#include <doctest/doctest.h>

#include <cmath>

#include "backends/compile.h"
#include "fusion/fuse.h"
#include "fusion/fused_group.h"
#include "fusion/recompute.h"
#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/passes/dead_code.h"
#include "graph/passes/verify.h"
#include "tests/support.h"

namespace kiln {
namespace {

using test::random_feeds;

struct Stored {
  int groups = 0;   // fused groups iterating over `shape`
  int outputs = 0;  // values of `shape` that fused groups write
};

// What the groups of fuse(g) store of values of `shape`.
Stored stored_of_shape(const Graph& g, const Shape& shape) {
  const Graph fused = eliminate_dead_code(fuse(g));
  verify(fused);
  Stored s;
  for (const Node& n : fused.nodes()) {
    const auto* body = n.body ? dynamic_cast<const FusedGroup*>(n.body.get()) : nullptr;
    if (body == nullptr || body->shape != shape) continue;
    ++s.groups;
    for (const TensorType& t : n.outputs) s.outputs += t.shape == shape;
  }
  return s;
}

Graph recomputed(const Graph& g) {
  Graph out = eliminate_dead_code(recompute_in_readers(g));
  verify(out);
  return out;
}

void check_same_values(const Graph& g, std::uint64_t seed, double tolerance) {
  const std::vector<Feed> feeds = random_feeds(g, seed);
  const Outputs reference = compile(g, {.fuse = false})->run(feeds);
  const Outputs fused = compile(g)->run(feeds);  // compile() runs the pass
  for (const auto& [name, tensor] : reference) {
    CAPTURE(name);
    CHECK(test::closeness(fused.at(name), tensor, tolerance, tolerance) <= 1.0);
  }
}

// c = x - m is made in the group of its sum of squares and read again by a group that needs
// that sum (z = c * (s + 1)): without the pass the first group writes c for the second.
Graph centred_twice(bool c_is_an_output) {
  Graph g;
  const Value x = g.input("x", {8, 6, 5, 5});
  const Value m = g.input("m", {1, 6, 1, 1});
  const Value c = x - m;
  const Value s = sum(c * c, {0, 2, 3}, true);
  g.output("z", c * (s + 1.0));
  if (c_is_an_output) g.output("c", c);
  return g;
}

TEST_CASE("recompute: a value read by a later group is made again there, not stored") {
  const Graph g = centred_twice(false);
  const Shape shape{8, 6, 5, 5};
  CHECK(stored_of_shape(g, shape).outputs == 2);  // c, z
  const Graph r = recomputed(g);
  CHECK(r.nodes().size() == g.nodes().size() + 1);  // one copy of c for the group of z
  CHECK(stored_of_shape(r, shape).outputs == 1);    // z
  CHECK(stored_of_shape(r, shape).groups == 2);
  check_same_values(g, 3, 1e-6);
}

TEST_CASE("recompute: values stored anyway, or made from two stored values, are read") {
  const Graph output = centred_twice(true);  // c is a graph output: stored whatever happens
  CHECK(recomputed(output).nodes().size() == output.nodes().size());
  Graph two;  // c = x * w reads two values of its size: recomputing it would read both
  const Value x = two.input("x", {4, 10}), w = two.input("w", {4, 10});
  const Value c = x * w;
  const Value s = sum(c, {1}, true);
  two.output("z", c / s);
  CHECK(recomputed(two).nodes().size() == two.nodes().size());
  Graph scalar;  // a scalar read by groups of other shapes: a copy could not join them
  const Value lr = scalar.input("lr", {});
  const Value step = lr * 0.5;
  scalar.output("a", scalar.input("p", {4}) * step);
  scalar.output("b", scalar.input("q", {5}) * step);
  CHECK(recomputed(scalar).nodes().size() == scalar.nodes().size());
  check_same_values(scalar, 5, 1e-6);
}

TEST_CASE("recompute: a chain of cheap nodes is copied whole, and the values stay") {
  Graph g;
  const Value x = g.input("x", {6, 7, 3, 3});
  const Value m = g.input("m", {1, 7, 1, 1});
  const Value c = relu(x - m) * 3.0;  // three nodes from one stored value
  const Value s = sum(c, {0, 2, 3}, true);
  g.output("z", c / (s + 1.0));
  const Graph r = recomputed(g);
  CHECK(r.nodes().size() == g.nodes().size() + 3);
  CHECK(stored_of_shape(r, {6, 7, 3, 3}).outputs == 1);
  check_same_values(g, 7, 1e-6);
}

// Batch norm in training mode with ReLU, as a network's layer sees it: x made outside the
// groups (a convolution's output; here a graph input), relu(y) read by a GEMM whose gradient
// arrives from outside the groups too.
Graph batch_norm_step(const Shape& shape) {
  Graph g;
  const Value x = g.input("x", shape);
  const Value gamma = g.input("gamma", {shape[1]});
  const Value beta = g.input("beta", {shape[1]});
  const std::int64_t features = shape.numel() / shape[0];
  const Value w = g.input("w", {features, 3});
  const BatchNormResult bn = batch_norm_training(x, gamma, beta, 1e-5);
  const Value h = relu(bn.y);
  const Value loss = sum_all(tanh(matmul(reshape(h, {shape[0], features}), w)));
  const std::vector<Value> grads = grad(loss, {x, gamma, beta});
  const std::vector<std::pair<const char*, Value>> outputs = {
      {"h", h},         {"loss", loss},       {"mean", bn.mean},  {"var", bn.var},
      {"dx", grads[0]}, {"dgamma", grads[1]}, {"dbeta", grads[2]}};
  for (const auto& [name, value] : outputs) g.output(name, value);
  return g;
}

TEST_CASE("recompute: relu's mask reads its recomputed input, not the stored output") {
  const Shape shape{6, 5, 4, 4};
  const Graph g = batch_norm_step(shape);
  auto mask_reads_relu = [](const Graph& graph) {
    int reads = 0;
    for (const Node& n : graph.nodes())
      reads += n.op->id == OpId::greater && graph.node(n.inputs[0].node).op->id == OpId::relu;
    return reads;
  };
  CHECK(mask_reads_relu(g) == 1);
  const Graph r = recomputed(g);
  CHECK(mask_reads_relu(r) == 0);
  auto greater = [](const Graph& graph) {
    int count = 0;
    for (const Node& n : graph.nodes()) count += n.op->id == OpId::greater;
    return count;
  };
  CHECK(greater(r) == greater(g));  // the mask is still there, on the copy of relu's input
  check_same_values(g, 17, 1e-5);
  // A relu whose input is two stored values of its size (a residual sum) keeps its output.
  Graph residual;
  const Value a = residual.input("a", shape), b = residual.input("b", shape);
  const Value h = relu(a + b);
  residual.output("h", h);
  residual.output("da", grad(sum_all(tanh(h) * sum(h, {0, 2, 3}, true)), {a})[0]);
  CHECK(mask_reads_relu(residual) == 1);
  CHECK(mask_reads_relu(recomputed(residual)) == 1);
  check_same_values(residual, 19, 1e-5);
}

TEST_CASE("batch norm: two passes over x forward, two backward, one activation stored between") {
  for (const Shape& shape : {Shape{16, 3, 12, 12}, Shape{1, 7, 5, 5}, Shape{9, 5}}) {
    CAPTURE(shape.str());
    const Graph g = recomputed(batch_norm_step(shape));
    const Stored s = stored_of_shape(g, shape);
    // Forward: the sums of x - k and of its square; the normalisation with ReLU (and the
    // loss's sum). Backward: the gradient's sums, storing dy * scale; dx from that and x. The
    // two-pass variance took five passes and also stored x - mean and its gradient.
    CHECK(s.groups == 4);
    CHECK(s.outputs == 3);  // relu(y), dy * scale, dx
    check_same_values(batch_norm_step(shape), 11, 2e-5);
  }
}

TEST_CASE("batch norm: the variance keeps its precision where the mean is large") {
  // Values 1e4 + [-1, 1): the variance (about 1/3) from sums of squares of x itself would
  // lose it to rounding (1e8 * 2^-24 = 6); shifted by one value of the channel it does not.
  Graph g;
  const Shape shape{32, 4, 6, 6};
  const Value x = g.input("x", shape);
  const BatchNormResult bn =
      batch_norm_training(x, g.input("gamma", {4}), g.input("beta", {4}), 1e-5);
  g.output("mean", bn.mean);
  g.output("var", bn.var);
  Tensor xs = test::random_tensor(shape, DType::f32, 17, -1.0, 1.0);
  for (std::int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] += 1e4f;
  const std::vector<Feed> feeds = {Feed("x", xs), Feed("gamma", Tensor::full({4}, 1.0, DType::f32)),
                                   Feed("beta", Tensor::zeros({4}, DType::f32))};
  const std::int64_t per_channel = 32 * 36;
  for (const bool fuse : {false, true}) {
    CAPTURE(fuse);
    const Outputs out = compile(g, {.fuse = fuse})->run(feeds);
    for (std::int64_t c = 0; c < 4; ++c) {
      double sum = 0, squares = 0;
      for (std::int64_t b = 0; b < 32; ++b)
        for (std::int64_t i = 0; i < 36; ++i) sum += xs.at((b * 4 + c) * 36 + i);
      const double mean = sum / static_cast<double>(per_channel);
      for (std::int64_t b = 0; b < 32; ++b)
        for (std::int64_t i = 0; i < 36; ++i) {
          const double d = xs.at((b * 4 + c) * 36 + i) - mean;
          squares += d * d;
        }
      const double var = squares / static_cast<double>(per_channel);
      CAPTURE(c);
      CHECK(std::abs(out.at("mean").at(c) - mean) <= 1e-3);
      CHECK(std::abs(out.at("var").at(c) - var) <= 1e-3 * var);
    }
  }
}

TEST_CASE("GPU: the recomputed groups and batch norm match the CPU") {
  if (!test::have_gpu()) return;
  test::check_gpu_matches_cpu(centred_twice(false), random_feeds(centred_twice(false), 13), 1e-5);
  for (const Shape& shape : {Shape{16, 3, 12, 12}, Shape{1, 7, 5, 5}, Shape{9, 5}}) {
    CAPTURE(shape.str());
    const Graph g = batch_norm_step(shape);
    test::check_gpu_matches_cpu(g, random_feeds(g, 19), 1e-4);
  }
}

}  // namespace
}  // namespace kiln
