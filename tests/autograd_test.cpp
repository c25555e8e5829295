// autograd through shared values and a whole LeNet, against finite differences.
#include <doctest/doctest.h>

#include "graph/autograd.h"
#include "graph/nn/functional.h"
#include "graph/op.h"
#include "graph/passes/dead_code.h"
#include "models/lenet.h"
#include "tests/support.h"

namespace kiln {

TEST_CASE("gradients accumulate over every consumer of a value") {
  Graph g;
  const Value x = g.input("x", {4}, DType::f64);
  const Value a = x * 3.0;
  const Value y = a * a + a + exp(x);  // d/dx = 18x + 3 + e^x
  g.output("dx", grad(sum_all(y), {x})[0]);
  const Tensor xv = Tensor::from_vector<double>({4}, {0.5, -1.0, 2.0, 0.0});
  const Tensor dx = test::run_once(g, {{"x", xv}}).at("dx");
  for (std::int64_t i = 0; i < 4; ++i)
    CHECK(dx.at(i) == doctest::Approx(18 * xv.at(i) + 3 + std::exp(xv.at(i))));
}

TEST_CASE("a value the loss does not depend on gets a zero gradient") {
  Graph g;
  const Value x = g.input("x", {3}, DType::f64);
  const Value unused = g.input("u", {2, 2}, DType::f64);
  const auto grads = grad(sum_all(x * x), {x, unused});
  g.output("du", grads[1]);
  const Tensor du = test::run_once(g, {{"x", Tensor::zeros({3}, DType::f64)},
                                       {"u", Tensor::zeros({2, 2}, DType::f64)}})
                        .at("du");
  CHECK(du.shape() == Shape{2, 2});
  for (std::int64_t i = 0; i < 4; ++i) CHECK(du.at(i) == 0.0);
}

// Counts nodes of op `name` that the outputs of `g` still use.
int live_ops(const Graph& g, const std::string& name) {
  const Graph live = eliminate_dead_code(g);
  int count = 0;
  for (const Node& n : live.nodes()) count += n.op->name == name;
  return count;
}

TEST_CASE("gradients of disjoint slices are joined by one concat, not summed as padded copies") {
  Graph g;
  const Value x = g.input("x", {2, 8}, DType::f64);
  // Gates at [0,2), [2,4), [6,8) (the range [4,6) unused, so zeros), [0,2) read twice.
  const Value y =
      tanh(slice(x, 1, 0, 2)) * slice(x, 1, 2, 2) + exp(slice(x, 1, 6, 2)) + slice(x, 1, 0, 2);
  const Value dx = grad(sum_all(y), {x})[0];
  g.output("dx", dx);
  CHECK(g.node(dx.ref().node).op->id == OpId::concat);
  CHECK(live_ops(g, "pad") == 0);
  CHECK(live_ops(g, "concat") == 1);
  const Tensor xv = test::random_tensor({2, 8}, DType::f64, 4);
  const Tensor d = test::run_once(g, {{"x", xv}}).at("dx");
  for (std::int64_t r = 0; r < 2; ++r)
    for (std::int64_t c = 0; c < 2; ++c) {
      const double a = xv.at(r * 8 + c), b = xv.at(r * 8 + c + 2), e = xv.at(r * 8 + c + 6);
      CHECK(d.at(r * 8 + c) == doctest::Approx((1 - std::tanh(a) * std::tanh(a)) * b + 1));
      CHECK(d.at(r * 8 + c + 2) == doctest::Approx(std::tanh(a)));
      CHECK(d.at(r * 8 + c + 4) == 0.0);
      CHECK(d.at(r * 8 + c + 6) == doctest::Approx(std::exp(e)));
    }
}

TEST_CASE("gradients of overlapping slices are summed") {
  Graph g;
  const Value x = g.input("x", {5}, DType::f64);
  const Value dx =
      grad(sum_all(slice(x, 0, 0, 3) * slice(x, 0, 2, 3)), {x})[0];  // x0 x2 + x1 x3 + x2 x4
  g.output("dx", dx);
  const Tensor xv = Tensor::from_vector<double>({5}, {1, 2, 3, 4, 5});
  const Tensor d = test::run_once(g, {{"x", xv}}).at("dx");
  const std::vector<double> expected = {3, 4, 1 + 5, 2, 3};
  for (std::int64_t i = 0; i < 5; ++i) CHECK(d.at(i) == expected[static_cast<std::size_t>(i)]);
}

TEST_CASE(
    "the gradient of a weight shared by several matmuls is one matmul of concatenated operands") {
  Graph g;
  const Value w = g.input("w", {3, 4}, DType::f64);
  Value h = g.input("h0", {2, 3}, DType::f64);
  Value loss = sum_all(h) * 0.0;
  for (int t = 0; t < 3; ++t) {  // a tiny recurrence: h <- tanh(h w[:, :3]) and a readout
    const Value pre = matmul(h, w);
    loss = loss + sum_all(pre * pre);
    h = tanh(slice(pre, 1, 0, 3));
  }
  const Value dw = grad(loss, {w})[0];
  g.output("dw", dw);
  g.output("loss", loss);
  const Node& n = g.node(dw.ref().node);
  REQUIRE(n.op->id == OpId::matmul);
  CHECK(g.node(n.inputs[0].node).op->id == OpId::concat);
  CHECK(g.node(n.inputs[1].node).op->id == OpId::concat);
  Tensor wv = test::random_tensor({3, 4}, DType::f64, 8);
  const Tensor h0 = test::random_tensor({2, 3}, DType::f64, 9);
  auto program = compile(g);
  const Tensor analytic = program->run({{"w", wv}, {"h0", h0}}).at("dw");
  for (std::int64_t k = 0; k < 12; ++k) {
    const double saved = wv.data<double>()[k];
    wv.data<double>()[k] = saved + 1e-6;
    const double up = program->run({{"w", wv}, {"h0", h0}}).at("loss").item();
    wv.data<double>()[k] = saved - 1e-6;
    const double down = program->run({{"w", wv}, {"h0", h0}}).at("loss").item();
    wv.data<double>()[k] = saved;
    CHECK(analytic.at(k) == doctest::Approx((up - down) / 2e-6).epsilon(1e-6));
  }
}

TEST_CASE("grad rejects a loss with more than one element") {
  Graph g;
  const Value x = g.input("x", {3});
  CHECK_THROWS_WITH_AS(grad(x * 2.0, {x}), doctest::Contains("loss must have one element"), Error);
}

TEST_CASE("the gradient of a whole LeNet matches finite differences (f64, sampled entries)") {
  Philox rng(1);
  LeNet model(rng);
  const std::vector<VariablePtr> params = model.parameters();
  REQUIRE(params.size() == 8);
  for (const VariablePtr& p : params) {
    p->value = p->value.to(DType::f64);
    if (p->name.ends_with("bias"))
      Philox(p->value.numel()).fill_uniform(p->value, -0.1, 0.1);  // non-zero biases
  }
  Graph g;
  const Value x = g.input("x", {2, 1, 28, 28}, DType::f64);
  const Value y = g.input("y", {2}, DType::i64);
  const Value loss = cross_entropy(model(x), y);
  std::vector<Value> wrt;
  for (const VariablePtr& p : params) wrt.push_back(g.variable(p));
  const std::vector<Value> grads = grad(loss, wrt);
  g.output("loss", loss);
  for (std::size_t i = 0; i < grads.size(); ++i) g.output(params[i]->name, grads[i]);
  auto program = compile(g);
  const std::vector<Feed> feeds = {{"x", test::random_tensor({2, 1, 28, 28}, DType::f64, 5)},
                                   {"y", Tensor::from_vector<std::int64_t>({2}, {3, 7})}};
  const Outputs analytic = program->run(feeds);

  Philox pick(17);
  for (const VariablePtr& p : params) {
    CAPTURE(p->name);
    for (int sample = 0; sample < 12; ++sample) {
      const auto k =
          static_cast<std::int64_t>(pick.next_below(static_cast<std::uint64_t>(p->value.numel())));
      double& w = p->value.data<double>()[k];
      const double saved = w;
      w = saved + 1e-5;
      const double up = program->run(feeds).at("loss").item();
      w = saved - 1e-5;
      const double down = program->run(feeds).at("loss").item();
      w = saved;
      const double numeric = (up - down) / 2e-5;
      CHECK(analytic.at(p->name).at(k) == doctest::Approx(numeric).epsilon(1e-5).scale(1e-3));
    }
  }
}

}  // namespace kiln
