// Every op of the table, and the composites, against central finite differences in f64.
// The last test fails when an op of the table has no case here.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <set>

#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/op.h"
#include "graph/op_table.h"
#include "graph/ops.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct InputSpec {
  Shape shape;
  double low = -1.0, high = 1.0;
};

struct GradCase {
  std::string op;    // the table op this case checks ("" for a composite)
  std::string name;  // shown on failure
  std::vector<InputSpec> inputs;
  std::function<Value(const std::vector<Value>&)> build;
};

// Inputs whose values are never within 0.05 of each other (or of 0 when positive/negative
// mixed): kinks of relu, max and pooling stay further away than the finite-difference step.
Tensor spread_values(const InputSpec& spec, std::uint64_t seed) {
  Tensor t = test::random_tensor(spec.shape, DType::f64, seed, spec.low, spec.high);
  const std::int64_t n = t.numel();
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
  Philox rng(seed + 7);
  for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.next_below(i)]);
  const double width = spec.high - spec.low;
  for (std::int64_t i = 0; i < n; ++i)  // a shuffled grid with a small jitter: distinct values
    t.data<double>()[order[static_cast<std::size_t>(i)]] =
        spec.low +
        width *
            (static_cast<double>(i) + 0.5 + 0.2 * (t.data<double>()[i] - spec.low) / width - 0.1) /
            static_cast<double>(n);
  return t;
}

void check_case(const GradCase& c) {
  CAPTURE(c.name);
  Graph g;
  std::vector<Value> inputs;
  std::vector<Tensor> values;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    inputs.push_back(g.input("in" + std::to_string(i), c.inputs[i].shape, DType::f64));
    values.push_back(spread_values(c.inputs[i], 100 + i));
  }
  const Value out = c.build(inputs);
  // loss = sum(out * R) with random R, so every output element's gradient matters.
  const Value weights = g.constant(test::random_tensor(out.shape(), DType::f64, 99));
  const Value loss = sum_all(out * weights);
  const std::vector<Value> grads = grad(loss, inputs);
  g.output("loss", loss);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output("grad" + std::to_string(i), grads[i]);
  auto program = compile(g);

  auto feeds = [&] {
    std::vector<Feed> f;
    for (std::size_t i = 0; i < values.size(); ++i)
      f.emplace_back("in" + std::to_string(i), values[i]);
    return f;
  };
  const Outputs analytic = program->run(feeds());
  constexpr double kStep = 1e-6;
  for (std::size_t i = 0; i < values.size(); ++i) {
    Tensor numeric = Tensor::empty(values[i].shape(), DType::f64);
    for (std::int64_t k = 0; k < values[i].numel(); ++k) {
      double& x = values[i].data<double>()[k];
      const double saved = x;
      x = saved + kStep;
      const double up = program->run(feeds()).at("loss").item();
      x = saved - kStep;
      const double down = program->run(feeds()).at("loss").item();
      x = saved;
      numeric.data<double>()[k] = (up - down) / (2 * kStep);
    }
    CAPTURE(i);
    CHECK(test::closeness(analytic.at("grad" + std::to_string(i)), numeric, 1e-6, 1e-5) <= 1.0);
  }
}

Value pick(const std::vector<Value>& v, std::size_t i) { return v[i]; }

// lstm_sequence's inputs projected [T*B, 4H], u [H, 4H], h0 and c0 [B, H] (nonzero).
std::vector<InputSpec> lstm_inputs(std::int64_t steps, std::int64_t batch, std::int64_t hidden) {
  return {{{steps * batch, 4 * hidden}, -2.0, 2.0},
          {{hidden, 4 * hidden}},
          {{batch, hidden}},
          {{batch, hidden}, -1.5, 1.5}};
}

// hs and the c after the last processed time (a slice of cs), stacked: [(T + 1) * B, H].
Value lstm_loss_terms(const std::vector<Value>& v, std::int64_t steps, bool reverse) {
  const LstmSequence s = lstm_sequence(v[0], v[1], v[2], v[3], steps, reverse);
  const std::int64_t batch = v[2].shape()[0];
  return concat({s.hs, slice(s.cs, 0, reverse ? 0 : (steps - 1) * batch, batch)}, 0);
}

std::vector<GradCase> elementwise_cases() {
  using V = const std::vector<Value>&;
  return {
      {"add", "add broadcast [3,4]+[4]", {{{3, 4}}, {{4}}}, [](V v) { return v[0] + v[1]; }},
      {"add",
       "add broadcast [2,1,3]+[4,1]",
       {{{2, 1, 3}}, {{4, 1}}},
       [](V v) { return v[0] + v[1]; }},
      {"sub", "sub broadcast [3,1]-[1,3]", {{{3, 1}}, {{1, 3}}}, [](V v) { return v[0] - v[1]; }},
      {"mul",
       "mul broadcast [2,3,1]*[1,4]",
       {{{2, 3, 1}}, {{1, 4}}},
       [](V v) { return v[0] * v[1]; }},
      {"mul", "mul by scalar constant", {{{5}}}, [](V v) { return v[0] * 3.0; }},
      {"div",
       "div broadcast [3,4]/[3,1]",
       {{{3, 4}}, {{3, 1}, 0.5, 2.0}},
       [](V v) { return v[0] / v[1]; }},
      {"maximum",
       "maximum broadcast [3,4],[4]",
       {{{3, 4}}, {{4}}},
       [](V v) { return maximum(v[0], v[1]); }},
      {"greater",
       "greater (zero gradient)",
       {{{6}}, {{6}}},
       [](V v) { return greater(v[0], v[1]) * v[0]; }},
      {"equal",
       "equal (zero gradient)",
       {{{6}}},
       [](V v) { return equal(v[0], v[0] * 2.0) + v[0]; }},
      {"select",
       "select broadcast [3,4] by a [4] mask",
       {{{4}}, {{3, 4}}, {{3, 4}}},
       [](V v) { return select(greater(v[0], scalar_like(v[0], 0.0)), v[1], v[2] * 2.0); }},
      {"neg", "neg", {{{7}}}, [](V v) { return -v[0]; }},
      {"exp", "exp", {{{2, 3}}}, [](V v) { return exp(v[0]); }},
      {"log", "log", {{{2, 3}, 0.2, 3.0}}, [](V v) { return log(v[0]); }},
      {"sqrt", "sqrt", {{{2, 3}, 0.2, 3.0}}, [](V v) { return sqrt(v[0]); }},
      {"relu", "relu", {{{3, 4}}}, [](V v) { return relu(v[0]); }},
      {"tanh", "tanh", {{{3, 4}, -2.0, 2.0}}, [](V v) { return tanh(v[0]); }},
      {"gelu", "gelu", {{{3, 4}, -3.0, 3.0}}, [](V v) { return gelu(v[0]); }},
      {"layer_norm",
       "layer_norm (weighted, so the loss is no constant)",
       {{{3, 5}, -2.0, 2.0}},
       [](V v) { return layer_norm(v[0]) * (v[0] + 2.0); }},
      {"broadcast_to",
       "broadcast_to [3,1]->[2,3,4]",
       {{{3, 1}}},
       [](V v) {
         return broadcast_to(v[0], {2, 3, 4});
       }},
  };
}

// Integer indices as a constant of the graph of `like`.
Value indices(const Value& like, const std::vector<std::int64_t>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::i64);
  std::copy(values.begin(), values.end(), t.data<std::int64_t>());
  return like.graph().constant(t);
}

std::vector<GradCase> structural_cases() {
  using V = const std::vector<Value>&;
  return {
      {"gather_rows",
       "gather_rows [4,3] by 6 indices, repeated, row 3 unused",
       {{{4, 3}}},
       [](V v) {
         return gather_rows(v[0], indices(v[0], {2, 0, 2, 0, 1, 2}));
       }},
      {"scatter_add_rows",
       "scatter_add_rows [6,3] into 4 rows, repeated, row 3 empty",
       {{{6, 3}}},
       [](V v) {
         return scatter_add_rows(v[0], indices(v[0], {2, 0, 2, 0, 1, 2}), 4);
       }},
      {"reduce_sum", "sum axis 0", {{{3, 4}}}, [](V v) { return sum(v[0], {0}); }},
      {"reduce_sum",
       "sum axes 0,2 keepdims",
       {{{2, 3, 4}}},
       [](V v) {
         return sum(v[0], {0, 2}, true);
       }},
      {"reduce_max", "max axis -1", {{{3, 5}}}, [](V v) { return max(v[0], {-1}); }},
      {"reduce_max",
       "max axes 1,2",
       {{{2, 3, 4}}},
       [](V v) {
         return max(v[0], {1, 2});
       }},
      {"reshape",
       "reshape [2,6]->[3,-1]",
       {{{2, 6}}},
       [](V v) {
         return reshape(v[0], {3, -1}) *
                v[0].graph().constant(test::random_tensor({3, 4}, DType::f64, 5));
       }},
      {"transpose",
       "transpose [2,3,4] perm 2,0,1",
       {{{2, 3, 4}}},
       [](V v) {
         return transpose(v[0], {2, 0, 1});
       }},
      {"slice",
       "slice [3,5,2] axis 1 [1,4)",
       {{{3, 5, 2}}},
       [](V v) { return slice(v[0], 1, 1, 3); }},
      {"slice", "slice [4,3] axis 0 [3,4)", {{{4, 3}}}, [](V v) { return slice(v[0], 0, 3, 1); }},
      {"concat",
       "concat [2,1,3],[2,2,3],[2,3,3] axis 1",
       {{{2, 1, 3}}, {{2, 2, 3}}, {{2, 3, 3}}},
       [](V v) {
         return concat({v[0], v[1], v[2]}, 1);
       }},
      {"concat",
       "concat of a value with itself, axis -1",
       {{{3, 2}}},
       [](V v) {
         return concat({v[0], v[0] * 2.0}, -1);
       }},
      {"pad", "pad [2,3] axis 1 by 1, 2", {{{2, 3}}}, [](V v) { return pad(v[0], 1, 1, 2); }},
      {"pad", "pad [3,2] axis 0 by 0, 1", {{{3, 2}}}, [](V v) { return pad(v[0], 0, 0, 1); }},
      {"",
       "four gate slices of one value, recombined",
       {{{2, 8}}},
       [](V v) {
         return tanh(slice(v[0], 1, 0, 2)) * slice(v[0], 1, 2, 2) + exp(slice(v[0], 1, 4, 2)) -
                slice(v[0], 1, 6, 2) * slice(v[0], 1, 0, 2);
       }},
      {"matmul", "matmul", {{{3, 4}}, {{4, 5}}}, [](V v) { return matmul(v[0], v[1]); }},
      {"matmul",
       "matmul a^T",
       {{{4, 3}}, {{4, 5}}},
       [](V v) { return matmul(v[0], v[1], true, false); }},
      {"matmul",
       "matmul b^T",
       {{{3, 4}}, {{5, 4}}},
       [](V v) { return matmul(v[0], v[1], false, true); }},
      {"matmul",
       "matmul a^T b^T",
       {{{4, 3}}, {{5, 4}}},
       [](V v) { return matmul(v[0], v[1], true, true); }},
      {"matmul",
       "batched matmul",
       {{{2, 3, 4}}, {{2, 4, 2}}},
       [](V v) { return matmul(v[0], v[1]); }},
      {"conv2d",
       "conv2d stride 1 pad 1",
       {{{2, 2, 5, 4}}, {{3, 2, 3, 3}}},
       [](V v) { return conv2d(v[0], v[1], 1, 1); }},
      {"conv2d",
       "conv2d stride 2 pad 0",
       {{{1, 2, 7, 6}}, {{2, 2, 3, 3}}},
       [](V v) { return conv2d(v[0], v[1], 2, 0); }},
      {"conv2d_grad_input",
       "conv2d_grad_input",
       {{{2, 3, 3, 2}}, {{3, 2, 3, 3}}},
       [](V v) {
         return conv2d_grad_input(v[0], v[1], {2, 2, 5, 4}, 2, 1);
       }},
      {"conv2d_grad_weight",
       "conv2d_grad_weight",
       {{{2, 2, 5, 4}}, {{2, 3, 3, 2}}},
       [](V v) {
         return conv2d_grad_weight(v[0], v[1], {3, 2, 3, 3}, 2, 1);
       }},
      {"max_pool2d", "max_pool2d 2/2", {{{2, 2, 4, 6}}}, [](V v) { return max_pool2d(v[0], 2); }},
      {"max_pool2d",
       "max_pool2d 3/1 (overlapping)",
       {{{1, 2, 5, 5}}},
       [](V v) { return max_pool2d(v[0], 3, 1); }},
      {"max_pool2d_grad",
       "max_pool2d_grad 3/1",
       {{{1, 2, 5, 5}}, {{1, 2, 3, 3}}},
       [](V v) { return max_pool2d_grad(v[0], v[1], 3, 1); }},
      {"random_uniform",
       "random_uniform (a constant factor)",
       {{{3, 5}}},
       [](V v) {
         return random_uniform(v[0].graph().constant(Tensor::from_vector<std::int64_t>({}, {3})),
                               {3, 5}, 11, DType::f64)
                    .values *
                v[0];
       }},
      {"all_reduce_mean",
       "all_reduce_mean over one process (group 0)",
       {{{3, 4}}, {{5}}},
       [](V v) {
         const std::vector<Value> means = all_reduce_mean({v[0] * v[0], v[1]}, 0);
         return means[0] * sum_all(means[1]);
       }},
      {"max_pool2d_select",
       "max_pool2d_select 2/2",
       {{{1, 2, 4, 4}}, {{1, 2, 4, 4}}},
       [](V v) { return max_pool2d_select(v[0], v[1], 2, 2); }},
      {"max_pool2d",
       "max_pool2d 3/1 pad 1 (Inception)",
       {{{1, 2, 4, 5}}},
       [](V v) { return max_pool2d(v[0], 3, 1, 1); }},
      {"max_pool2d",
       "max_pool2d 3/2 pad 1",
       {{{2, 1, 5, 6}}},
       [](V v) { return max_pool2d(v[0], 3, 2, 1); }},
      {"max_pool2d_grad",
       "max_pool2d_grad 3/2 pad 1",
       {{{1, 2, 5, 6}}, {{1, 2, 3, 3}}},
       [](V v) { return max_pool2d_grad(v[0], v[1], 3, 2, 1); }},
      {"max_pool2d_grad",
       "max_pool2d_grad 2/2 relu=1 (dy masked by the pooled maximum > 0)",
       {{{1, 2, 4, 6}}, {{1, 2, 2, 3}}},
       [](V v) { return max_pool2d_grad(v[0] - 0.5, v[1], 2, 2, 0, /*relu=*/true); }},
      {"max_pool2d_select",
       "max_pool2d_select 3/1 pad 1",
       {{{1, 2, 4, 4}}, {{1, 2, 4, 4}}},
       [](V v) { return max_pool2d_select(v[0], v[1], 3, 1, 1); }},
      {"avg_pool2d", "avg_pool2d 2/2", {{{2, 2, 4, 6}}}, [](V v) { return avg_pool2d(v[0], 2); }},
      {"avg_pool2d",
       "avg_pool2d 3/1 pad 1",
       {{{1, 2, 4, 5}}},
       [](V v) { return avg_pool2d(v[0], 3, 1, 1); }},
      {"avg_pool2d",
       "avg_pool2d 3/2 pad 1, odd sizes",
       {{{2, 1, 7, 5}}},
       [](V v) { return avg_pool2d(v[0], 3, 2, 1); }},
      {"avg_pool2d",
       "avg_pool2d 2/3 (gapped)",
       {{{1, 2, 7, 8}}},
       [](V v) { return avg_pool2d(v[0], 2, 3); }},
      {"avg_pool2d_grad",
       "avg_pool2d_grad 3/2 pad 1",
       {{{1, 2, 3, 3}}},
       [](V v) {
         return avg_pool2d_grad(v[0], {1, 2, 5, 6}, 3, 2, 1);
       }},
      {"avg_pool2d_grad",
       "avg_pool2d_grad 3/1 pad 1",
       {{{2, 1, 4, 4}}},
       [](V v) {
         return avg_pool2d_grad(v[0], {2, 1, 4, 4}, 3, 1, 1);
       }},
      {"lstm_sequence", "lstm_sequence T=3 B=2 H=3 forward (hs and the final c)",
       lstm_inputs(3, 2, 3), [](V v) { return lstm_loss_terms(v, 3, false); }},
      {"lstm_sequence", "lstm_sequence T=3 B=2 H=3 reverse (hs and the final c)",
       lstm_inputs(3, 2, 3), [](V v) { return lstm_loss_terms(v, 3, true); }},
      {"lstm_sequence", "lstm_sequence T=1 B=3 H=1 (one step)", lstm_inputs(1, 3, 1),
       [](V v) { return lstm_loss_terms(v, 1, false); }},
  };
}

std::vector<GradCase> composite_cases() {
  using V = const std::vector<Value>&;
  return {
      {"", "sigmoid", {{{3, 4}, -3.0, 3.0}}, [](V v) { return sigmoid(v[0]); }},
      {"", "leaky_relu", {{{3, 4}}}, [](V v) { return leaky_relu(v[0], 0.2); }},
      {"", "mean axes 0", {{{3, 4}}}, [](V v) { return mean(v[0], {0}); }},
      {"", "global_avg_pool", {{{2, 3, 4, 5}}}, [](V v) { return global_avg_pool(v[0]); }},
      {"", "log_softmax", {{{3, 5}, -3.0, 3.0}}, [](V v) { return log_softmax(v[0], 1); }},
      {"", "softmax", {{{3, 5}, -3.0, 3.0}}, [](V v) { return softmax(v[0], 1); }},
      {"",
       "bce_with_logits",
       {{{3, 4}, -4.0, 4.0}, {{3, 4}, 0.0, 1.0}},
       [](V v) { return bce_with_logits(v[0], v[1]); }},
      {"",
       "bce_with_logits (target 1)",
       {{{5, 1}, -4.0, 4.0}},
       [](V v) { return bce_with_logits(v[0], 1.0); }},
      {"",
       "shared value (two consumers)",
       {{{4}}},
       [](V v) { return v[0] * v[0] + exp(v[0]) * pick(v, 0); }},
      {"",
       "conv_transpose2d k3 s2 p1 output_padding 1",
       {{{2, 3, 3, 2}}, {{3, 2, 3, 3}}},
       [](V v) { return conv_transpose2d(v[0], v[1], 2, 1, 1); }},
      {"",
       "conv_transpose2d k4 s2 p1 (DCGAN)",
       {{{1, 2, 3, 3}}, {{2, 3, 4, 4}}},
       [](V v) { return conv_transpose2d(v[0], v[1], 2, 1); }},
      {"",
       "batch_norm training [4,3,2,2] (x, gamma, beta)",
       {{{4, 3, 2, 2}, -2.0, 2.0}, {{3}, 0.5, 1.5}, {{3}}},
       [](V v) { return batch_norm_training(v[0], v[1], v[2], 1e-5).y; }},
      {"",
       "batch_norm training [5,4] (x, gamma, beta)",
       {{{5, 4}, -2.0, 2.0}, {{4}, 0.5, 1.5}, {{4}}},
       [](V v) { return batch_norm_training(v[0], v[1], v[2], 1e-5).y; }},
      {"",
       "batch_norm inference (x, gamma, beta, mean, var)",
       {{{3, 2, 2, 2}}, {{2}}, {{2}}, {{2}}, {{2}, 0.5, 2.0}},
       [](V v) { return batch_norm_inference(v[0], v[1], v[2], v[3], v[4], 1e-5); }},
  };
}

}  // namespace

TEST_CASE("gradients of elementwise ops match finite differences") {
  for (const GradCase& c : elementwise_cases()) check_case(c);
}

TEST_CASE("gradients of reductions, layout, matmul, conv and pooling match finite differences") {
  for (const GradCase& c : structural_cases()) check_case(c);
}

TEST_CASE("gradients of composite ops match finite differences") {
  for (const GradCase& c : composite_cases()) check_case(c);
}

TEST_CASE("cross_entropy gradient matches finite differences (one_hot inside)") {
  Graph g;
  const Value logits = g.input("logits", {4, 5}, DType::f64);
  const Value labels = g.input("labels", {4}, DType::i64);
  const Value loss = cross_entropy(logits, labels);
  g.output("loss", loss);
  g.output("grad", grad(loss, {logits})[0]);
  auto program = compile(g);
  Tensor x = test::random_tensor({4, 5}, DType::f64, 3, -2, 2);
  const Tensor y = Tensor::from_vector<std::int64_t>({4}, {0, 4, 2, 2});
  const Tensor analytic = program->run({{"logits", x}, {"labels", y}}).at("grad");
  Tensor numeric = Tensor::empty({4, 5}, DType::f64);
  for (std::int64_t k = 0; k < x.numel(); ++k) {
    const double saved = x.data<double>()[k];
    x.data<double>()[k] = saved + 1e-6;
    const double up = program->run({{"logits", x}, {"labels", y}}).at("loss").item();
    x.data<double>()[k] = saved - 1e-6;
    const double down = program->run({{"logits", x}, {"labels", y}}).at("loss").item();
    x.data<double>()[k] = saved;
    numeric.data<double>()[k] = (up - down) / 2e-6;
  }
  CHECK(test::closeness(analytic, numeric, 1e-7, 1e-5) <= 1.0);
}

TEST_CASE(
    "bce_with_logits stays finite and exact for large logits, with gradient (sigmoid(x) - t) / N") {
  const std::vector<double> x = {-100.0, -3.0, 0.0, 2.0, 100.0, 30.0},
                            t = {0.0, 1.0, 0.5, 1.0, 1.0, 0.0};
  Graph g;
  const Value logits = g.input("x", {6}, DType::f32);
  const Value loss = bce_with_logits(logits, g.constant(Tensor::from_values({6}, t, DType::f32)));
  g.output("loss", loss);
  g.output("grad", grad(loss, {logits})[0]);
  const Outputs out = test::run_once(g, {{"x", Tensor::from_values({6}, x, DType::f32)}});
  double expected = 0;
  for (std::size_t i = 0; i < x.size();
       ++i) {  // -t log s(x) - (1 - t) log(1 - s(x)), each log stably
    const double log_s = -std::log1p(std::exp(-std::abs(x[i]))) + std::min(x[i], 0.0);
    const double log_not_s = log_s - x[i];
    expected += -(t[i] * log_s + (1 - t[i]) * log_not_s) / 6.0;
    const double sigmoid = 1.0 / (1.0 + std::exp(-x[i]));
    CHECK(out.at("grad").at(static_cast<std::int64_t>(i)) ==
          doctest::Approx((sigmoid - t[i]) / 6.0).epsilon(1e-5));
  }
  CHECK(std::isfinite(out.at("loss").item()));
  CHECK(out.at("loss").item() == doctest::Approx(expected).epsilon(1e-5));
}

TEST_CASE(
    "bce_with_logits rejects targets that would broadcast the logits, and targets outside [0, 1]") {
  Graph g;
  const Value logits = g.input("x", {4, 1});
  CHECK_THROWS_WITH_AS(bce_with_logits(logits, g.input("t", {4})),
                       doctest::Contains("targets f32[4] do not broadcast to logits f32[4, 1]"),
                       Error);
  CHECK_THROWS_WITH_AS(bce_with_logits(logits, 1.5),
                       doctest::Contains("target 1.5 is not in [0, 1]"), Error);
}

TEST_CASE("detach passes the value and cuts the gradient") {
  Graph g;
  const Value x = g.input("x", {3}, DType::f64);
  const Value y = detach(x) * x;  // value x*x, gradient x (not 2x)
  const Value dx = grad(sum_all(y), {x})[0];
  g.output("y", y);
  g.output("dx", dx);
  const Tensor xv = Tensor::from_vector<double>({3}, {1.5, -2.0, 0.25});
  const Outputs out = test::run_once(g, {{"x", xv}});
  for (std::int64_t i = 0; i < 3; ++i) {
    CHECK(out.at("y").at(i) == doctest::Approx(xv.at(i) * xv.at(i)));
    CHECK(out.at("dx").at(i) == doctest::Approx(xv.at(i)));
  }
}

TEST_CASE("every op of the table has a gradient check") {
  std::set<std::string> checked = {"one_hot", "detach"};  // the two tests above
  checked.insert("lstm_sequence_grad");  // no gradient of its own: lstm_sequence's cases check it
  checked.insert("layer_norm_grad");     // likewise, checked through layer_norm's case
  checked.insert("cast");                // rounds: low_precision_test checks its gradient exactly
  checked.insert("matmul_bias");     // made after autograd (fusion/gemm_epilogues.h): no gradient
  checked.insert("conv2d_bias");     // likewise
  checked.insert("conv2d_moments");  // likewise (fusion/conv_statistics.h)
  checked.insert("conv_filter_layout");  // likewise (graph/passes/filter_layouts.h)
  for (const auto& cases : {elementwise_cases(), structural_cases()})
    for (const GradCase& c : cases) checked.insert(c.op);
  for (const OpDef* op : all_ops()) {
    if (op->kind == OpKind::source || op->kind == OpKind::fused)
      continue;  // leaves; fusion runs after autograd
    CAPTURE(op->name);
    CHECK(checked.count(op->name) == 1);
  }
}

}  // namespace kiln

namespace kiln {

TEST_CASE("layer_norm's CPU kernel equals (x - mean) / sqrt(var + eps) from primitives, in f64") {
  Graph g;
  const Value x = g.input("x", {5, 7}, DType::f64);
  const Value centred = x - sum(x, {1}, true) / 7.0;
  const Value var = sum(centred * centred, {1}, true) / 7.0;
  g.output("op", layer_norm(x, 1e-3));
  g.output("composite", centred / sqrt(var + 1e-3));
  const Tensor in = test::random_tensor({5, 7}, DType::f64, 5, -3.0, 3.0);
  const Outputs out = compile(g, {.fuse = false})->run({{x, in}});
  for (std::int64_t i = 0; i < 35; ++i)
    CHECK(out.at("op").data<double>()[i] ==
          doctest::Approx(out.at("composite").data<double>()[i]).epsilon(1e-12));
}

}  // namespace kiln
