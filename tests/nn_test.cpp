// nn modules: buffers, train/eval mode, state updates chained within one step, batch norm.
#include <doctest/doctest.h>

#include <cmath>

#include "graph/autograd.h"
#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/nn/module.h"
#include "tests/support.h"

namespace kiln {
namespace {

// A layer with one parameter and one buffer that counts its applications.
class Counting : public nn::Layer {
 public:
  Counting() {
    weight_ = register_parameter("weight", Tensor::full({2}, 1.0, DType::f32));
    count_ = register_buffer("count", Tensor::zeros({}, DType::f32));
  }
  Value forward(Value x) override {
    Graph& g = x.graph();
    if (training()) g.assign_latest(count_, g.latest(count_) + 1.0);
    return x * g.variable(weight_);
  }

 private:
  VariablePtr weight_, count_;
};

class Pair : public nn::Layer {
 public:
  Pair() {
    register_module("a", a_);
    register_module("b", b_);
  }
  Value forward(Value x) override { return b_(a_(x)); }
  Counting a_, b_;
};

}  // namespace

TEST_CASE("buffers are named like parameters and are not trainable") {
  Pair model;
  const auto params = model.parameters();
  const auto buffers = model.buffers();
  REQUIRE(params.size() == 2);
  REQUIRE(buffers.size() == 2);
  CHECK(params[0]->name == "a.weight");
  CHECK(buffers[0]->name == "a.count");
  CHECK(buffers[1]->name == "b.count");
  CHECK(params[0]->trainable);
  CHECK_FALSE(buffers[0]->trainable);
  nn::Sequential seq;
  seq.add<Counting>();
  CHECK(seq.buffers()[0]->name == "0.count");
}

TEST_CASE("set_training reaches every child, a child registered later takes the parent's mode") {
  Pair model;
  CHECK(model.training());
  model.set_training(false);
  CHECK_FALSE(model.a_.training());
  CHECK_FALSE(model.b_.training());
  model.set_training(true);
  CHECK(model.b_.training());
  nn::Sequential seq;
  seq.set_training(false);
  CHECK_FALSE(seq.add<Counting>().training());
}

TEST_CASE("a layer applied twice in one step chains its buffer updates, eval mode records none") {
  Counting layer;
  Graph g;
  const Value x = g.input("x", {2});
  g.output("y", layer(layer(x)));
  CHECK(g.assignments().size() == 1);
  auto step = compile(g);
  step->run({{"x", Tensor::full({2}, 1.0, DType::f32)}});
  step->run({{"x", Tensor::full({2}, 1.0, DType::f32)}});
  CHECK(layer.buffers()[0]->value.item() == 4.0);

  layer.set_training(false);
  Graph eval;
  eval.output("y", layer(eval.input("x", {2})));
  CHECK(eval.assignments().empty());
}

TEST_CASE("assign_latest rejects a value of the wrong type") {
  Counting layer;
  Graph g;
  g.output("y", layer(g.input("x", {2})));
  const VariablePtr count = layer.buffers()[0];
  CHECK_THROWS_WITH_AS(g.assign_latest(count, g.fill(0.0, {3})),
                       doctest::Contains("update of 'count'"), Error);
}

namespace {

// Per-channel mean and biased variance of x: [B, C, H, W] (host, double).
std::pair<std::vector<double>, std::vector<double>> channel_stats(const Tensor& x) {
  const std::int64_t b = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  std::vector<double> mean(static_cast<std::size_t>(c), 0.0), var(static_cast<std::size_t>(c), 0.0);
  for (std::int64_t ch = 0; ch < c; ++ch) {
    double sum = 0, sq = 0;
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t k = 0; k < hw; ++k) sum += x.at((i * c + ch) * hw + k);
    const double m = sum / static_cast<double>(b * hw);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t k = 0; k < hw; ++k)
        sq += (x.at((i * c + ch) * hw + k) - m) * (x.at((i * c + ch) * hw + k) - m);
    mean[static_cast<std::size_t>(ch)] = m;
    var[static_cast<std::size_t>(ch)] = sq / static_cast<double>(b * hw);
  }
  return {mean, var};
}

}  // namespace

TEST_CASE(
    "BatchNorm2d training: normalised output, running stats blended with momentum 0.1 (unbiased "
    "variance)") {
  nn::BatchNorm2d bn(3);
  CHECK(bn.parameters().size() == 2);
  REQUIRE(bn.buffers().size() == 2);
  CHECK(bn.buffers()[0]->name == "running_mean");
  Graph g;
  g.output("y", bn(g.input("x", {4, 3, 5, 2})));
  auto step = compile(g);
  const Tensor x1 = test::random_tensor({4, 3, 5, 2}, DType::f32, 1, -1, 3);
  const Tensor x2 = test::random_tensor({4, 3, 5, 2}, DType::f32, 2, 2, 5);
  const Tensor y = step->run({{"x", x1}}).at("y");
  step->run({{"x", x2}});
  const auto [m1, v1] = channel_stats(x1);
  const auto [m2, v2] = channel_stats(x2);
  const double n = 40, unbiased = n / (n - 1);
  for (std::size_t c = 0; c < 3; ++c) {
    CAPTURE(c);
    const double mean_after_1 = 0.9 * 0.0 + 0.1 * m1[c],
                 var_after_1 = 0.9 * 1.0 + 0.1 * v1[c] * unbiased;
    CHECK(bn.running_mean()->value.at(static_cast<std::int64_t>(c)) ==
          doctest::Approx(0.9 * mean_after_1 + 0.1 * m2[c]).epsilon(1e-5));
    CHECK(bn.running_var()->value.at(static_cast<std::int64_t>(c)) ==
          doctest::Approx(0.9 * var_after_1 + 0.1 * v2[c] * unbiased).epsilon(1e-5));
  }
  const auto [ym, yv] = channel_stats(y);  // gamma 1, beta 0: zero mean, unit variance
  for (std::size_t c = 0; c < 3; ++c) {
    CHECK(std::abs(ym[c]) < 1e-5);
    CHECK(yv[c] == doctest::Approx(v1[c] / (v1[c] + 1e-5)).epsilon(1e-4));
  }
}

TEST_CASE("BatchNorm eval mode uses the running statistics, not the batch's") {
  nn::BatchNorm2d bn(2);
  bn.running_mean()->value = Tensor::from_vector<float>({2}, {0.5f, -1.0f});
  bn.running_var()->value = Tensor::from_vector<float>({2}, {4.0f, 0.25f});
  bn.weight()->value = Tensor::from_vector<float>({2}, {2.0f, 1.0f});
  bn.bias()->value = Tensor::from_vector<float>({2}, {0.0f, 3.0f});
  bn.set_training(false);
  Graph g;
  g.output("y", bn(g.input("x", {1, 2, 2, 3})));  // a batch of one: no statistics of its own
  CHECK(g.assignments().empty());
  const Tensor x = test::random_tensor({1, 2, 2, 3}, DType::f32, 4, -2, 2);
  const Tensor y = test::run_once(g, {{"x", x}}).at("y");
  const double mean[] = {0.5, -1.0}, var[] = {4.0, 0.25}, gamma[] = {2.0, 1.0}, beta[] = {0.0, 3.0};
  for (std::int64_t i = 0; i < 12; ++i) {
    const std::size_t c = static_cast<std::size_t>(i / 6);
    CHECK(y.at(i) ==
          doctest::Approx((x.at(i) - mean[c]) / std::sqrt(var[c] + 1e-5) * gamma[c] + beta[c])
              .epsilon(1e-5));
  }
  CHECK(bn.running_mean()->value.at(0) == 0.5);  // untouched
}

TEST_CASE("BatchNorm1d: [B, F] statistics over the batch, bad inputs are clear errors") {
  nn::BatchNorm1d bn(3);
  Graph g;
  const Value x = g.input("x", {4, 3});
  g.output("y", bn(x));
  const Tensor xv = Tensor::from_vector<float>({4, 3}, {1, 10, 0, 2, 20, 0, 3, 30, 0, 4, 40, 4});
  test::run_once(g, {{"x", xv}});
  CHECK(bn.running_mean()->value.at(0) == doctest::Approx(0.25));  // 0.1 * 2.5
  CHECK(bn.running_mean()->value.at(1) == doctest::Approx(2.5));
  CHECK(bn.running_var()->value.at(0) ==
        doctest::Approx(0.9 + 0.1 * 5.0 / 3.0));  // unbiased variance of 1..4
  Graph bad;
  CHECK_THROWS_WITH_AS(
      bn(bad.input("x", {4, 5})),
      doctest::Contains("BatchNorm1d(3): input is f32[4, 5] but [B, 3] was expected"), Error);
  CHECK_THROWS_WITH_AS(bn(bad.input("one", {1, 3})),
                       doctest::Contains("more than one value per channel"), Error);
  nn::BatchNorm2d bn2(3);
  CHECK_THROWS_WITH_AS(bn2(bad.input("x2", {4, 3})), doctest::Contains("[B, 3, H, W] was expected"),
                       Error);
}

TEST_CASE("BatchNorm applied twice in one step chains the running statistics") {
  nn::BatchNorm1d bn(1);
  Graph g;
  const Value a = g.input("a", {2, 1}), b = g.input("b", {2, 1});
  g.output("ya", bn(a));
  g.output("yb", bn(b));
  test::run_once(g, {{"a", Tensor::from_vector<float>({2, 1}, {1, 3})},
                     {"b", Tensor::from_vector<float>({2, 1}, {10, 10})}});
  CHECK(bn.running_mean()->value.at(0) == doctest::Approx(0.9 * 0.2 + 0.1 * 10));
}

TEST_CASE(
    "ConvTranspose2d: each input pixel scatters weight * value into a stride-spaced window (direct "
    "loop)") {
  Philox rng(7);
  nn::ConvTranspose2d up({.in_channels = 3,
                          .out_channels = 2,
                          .kernel = 3,
                          .stride = 2,
                          .padding = 1,
                          .output_padding = 1},
                         rng);
  const auto params = up.parameters();
  REQUIRE(params.size() == 2);
  CHECK(params[0]->value.shape() == Shape{3, 2, 3, 3});  // [Cin, Cout, K, K] as PyTorch
  params[1]->value = Tensor::from_vector<float>({2}, {0.5f, -0.25f});
  Graph g;
  const Value y = up(g.input("x", {2, 3, 4, 5}));
  REQUIRE(y.shape() == Shape{2, 2, 8, 10});  // (4 - 1) * 2 - 2 + 3 + 1, (5 - 1) * 2 - 2 + 3 + 1
  g.output("y", y);
  const Tensor x = test::random_tensor({2, 3, 4, 5}, DType::f32, 8);
  const Tensor out = test::run_once(g, {{"x", x}}).at("y");
  std::vector<double> expected(2 * 2 * 8 * 10);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t co = 0; co < 2; ++co)
      for (std::int64_t k = 0; k < 80; ++k)
        expected[static_cast<std::size_t>((b * 2 + co) * 80 + k)] = params[1]->value.at(co);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t ci = 0; ci < 3; ++ci)
      for (std::int64_t ih = 0; ih < 4; ++ih)
        for (std::int64_t iw = 0; iw < 5; ++iw)
          for (std::int64_t co = 0; co < 2; ++co)
            for (std::int64_t kh = 0; kh < 3; ++kh)
              for (std::int64_t kw = 0; kw < 3; ++kw) {
                const std::int64_t oh = ih * 2 - 1 + kh, ow = iw * 2 - 1 + kw;
                if (oh < 0 || oh >= 8 || ow < 0 || ow >= 10) continue;
                expected[static_cast<std::size_t>(((b * 2 + co) * 8 + oh) * 10 + ow)] +=
                    x.at(((b * 3 + ci) * 4 + ih) * 5 + iw) *
                    params[0]->value.at(((ci * 2 + co) * 3 + kh) * 3 + kw);
              }
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    CAPTURE(i);
    CHECK(out.at(i) ==
          doctest::Approx(expected[static_cast<std::size_t>(i)]).epsilon(1e-5).scale(1));
  }
  Graph bad;
  CHECK_THROWS_WITH_AS(up(bad.input("x", {2, 4, 4, 4})),
                       doctest::Contains("ConvTranspose2d(3 -> 2): input is f32[2, 4, 4, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(
      conv_transpose2d(bad.input("a", {1, 3, 2, 2}), bad.input("w", {3, 2, 3, 3}), 2, 1, 2),
      doctest::Contains("output_padding 2"), Error);
}

TEST_CASE("LeakyReLU, Sigmoid and Tanh layers") {
  Graph g;
  const Value x = g.input("x", {4});
  nn::LeakyReLU leaky(0.2);
  nn::Sigmoid sig;
  nn::Tanh th;
  g.output("leaky", leaky(x));
  g.output("sigmoid", sig(x));
  g.output("tanh", th(x));
  const std::vector<float> xs = {-2.0f, -0.5f, 0.0f, 3.0f};
  const Outputs out = test::run_once(g, {{"x", Tensor::from_vector<float>({4}, xs)}});
  for (std::int64_t i = 0; i < 4; ++i) {
    const double v = xs[static_cast<std::size_t>(i)];
    CHECK(out.at("leaky").at(i) == doctest::Approx(v > 0 ? v : 0.2 * v));
    CHECK(out.at("sigmoid").at(i) == doctest::Approx(1 / (1 + std::exp(-v))));
    CHECK(out.at("tanh").at(i) == doctest::Approx(std::tanh(v)));
  }
  CHECK_THROWS_WITH_AS(nn::LeakyReLU(1.5),
                       doctest::Contains("LeakyReLU: slope 1.5 must be in [0, 1]"), Error);
}

// Label smoothing: the loss against (1 - e) one_hot + e / C, computed here in f64, and its
// gradient (softmax(x) - targets) / N, for e = 0 (the plain loss), 0.1 and 1 (uniform targets).
TEST_CASE("cross_entropy with label smoothing: its value and its gradient, in f64") {
  const std::int64_t n = 4, c = 5;
  const Tensor x = test::random_tensor({n, c}, DType::f64, 7, -3, 3);
  const std::vector<std::int64_t> labels = {0, 4, 2, 2};
  for (double e : {0.0, 0.1, 1.0}) {
    CAPTURE(e);
    Graph g;
    const Value logits = g.input("x", {n, c}, DType::f64);
    const Value loss = cross_entropy(logits, g.input("y", {n}, DType::i64), e);
    g.output("loss", loss);
    g.output("grad", grad(loss, {logits})[0]);
    const Outputs out =
        test::run_once(g, {{"x", x}, {"y", Tensor::from_vector<std::int64_t>({n}, labels)}});
    double want = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      double top = -1e300, total = 0;
      for (std::int64_t k = 0; k < c; ++k) top = std::max(top, x.at(r * c + k));
      for (std::int64_t k = 0; k < c; ++k) total += std::exp(x.at(r * c + k) - top);
      for (std::int64_t k = 0; k < c; ++k) {
        const double target = (k == labels[r] ? 1 - e : 0) + e / c;
        const double log_p = x.at(r * c + k) - top - std::log(total);
        want -= target * log_p / n;
        CHECK(out.at("grad").at(r * c + k) ==
              doctest::Approx((std::exp(log_p) - target) / n).epsilon(1e-12));
      }
    }
    CHECK(out.at("loss").item() == doctest::Approx(want).epsilon(1e-12));
  }
  Graph g;
  CHECK_THROWS_WITH_AS(cross_entropy(g.input("x", {n, c}), g.input("y", {n}, DType::i64), 1.5),
                       doctest::Contains("label smoothing 1.5 is not in [0, 1]"), Error);
}

}  // namespace kiln
