// Optimizers: two steps of each against the update rules computed by hand (PyTorch's).
#include <doctest/doctest.h>

#include "graph/autograd.h"
#include "graph/ops.h"
#include "graph/optim.h"
#include "tests/support.h"

namespace kiln {
namespace {

// loss = sum(c * p): the gradient is c, constant, so expected updates are easy to write down.
struct Quadratic {
  VariablePtr p = make_variable("p", Tensor::from_vector<double>({3}, {1.0, -2.0, 0.5}));
  std::vector<double> c = {0.3, -1.2, 2.0};
  std::unique_ptr<Program> step(Optimizer& opt) {
    graph = std::make_unique<Graph>();
    const Value pv = graph->variable(p);
    const Value loss = sum_all(pv * graph->constant(Tensor::from_vector<double>({3}, c)));
    return compile_training(loss, {p}, opt);
  }
  std::unique_ptr<Graph> graph;
};

}  // namespace

TEST_CASE("sgd with momentum, nesterov and weight decay follows the PyTorch rule") {
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    Quadratic q;
    Sgd opt({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
    auto step = q.step(opt);
    std::vector<double> p = {1.0, -2.0, 0.5}, buf = {0, 0, 0};
    for (int s = 0; s < 3; ++s) {
      step->run({});
      for (std::size_t i = 0; i < 3; ++i) {
        const double g = q.c[i] + 0.01 * p[i];
        buf[i] = 0.9 * buf[i] + g;
        p[i] -= 0.1 * (nesterov ? g + 0.9 * buf[i] : buf[i]);
        CHECK(q.p->value.at(static_cast<std::int64_t>(i)) == doctest::Approx(p[i]).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("adam and adamw follow the PyTorch rule, bias correction included") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    Quadratic q;
    Adam opt({.lr = 0.01,
              .beta1 = 0.8,
              .beta2 = 0.95,
              .eps = 1e-8,
              .weight_decay = 0.1,
              .decoupled_weight_decay = decoupled});
    auto step = q.step(opt);
    std::vector<double> p = {1.0, -2.0, 0.5}, m = {0, 0, 0}, v = {0, 0, 0};
    for (int t = 1; t <= 3; ++t) {
      step->run({});
      for (std::size_t i = 0; i < 3; ++i) {
        double g = q.c[i];
        if (!decoupled) g += 0.1 * p[i];
        if (decoupled) p[i] *= 1 - 0.01 * 0.1;
        m[i] = 0.8 * m[i] + 0.2 * g;
        v[i] = 0.95 * v[i] + 0.05 * g * g;
        const double mhat = m[i] / (1 - std::pow(0.8, t)), vhat = v[i] / (1 - std::pow(0.95, t));
        p[i] -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
        CHECK(q.p->value.at(static_cast<std::int64_t>(i)) == doctest::Approx(p[i]).epsilon(1e-10));
      }
    }
  }
}

TEST_CASE("set_lr changes the step without recompiling") {
  Quadratic q;
  Sgd opt({.lr = 0.1});
  auto step = q.step(opt);
  step->run({});
  CHECK(q.p->value.at(0) == doctest::Approx(1.0 - 0.1 * 0.3));
  opt.set_lr(0.5);
  step->run({});
  CHECK(q.p->value.at(0) == doctest::Approx(1.0 - 0.1 * 0.3 - 0.5 * 0.3));
  CHECK_THROWS_AS(opt.set_lr(-1), Error);
}

TEST_CASE("optimizer state is exposed for checkpoints") {
  Quadratic q;
  Adam opt({});
  auto step = q.step(opt);
  std::vector<std::string> names;
  for (const VariablePtr& v : opt.state()) names.push_back(v->name);
  CHECK(names.size() == 4);  // lr, step, m and v of p
  CHECK(std::find(names.begin(), names.end(), "optimizer.p.m") != names.end());
}

TEST_CASE("adam counts its steps exactly past 2^24, where f32 stops counting") {
  VariablePtr p = make_variable("p", Tensor::from_vector<float>({2}, {1.0f, -1.0f}));
  Graph g;
  const Value loss = sum_all(g.variable(p) * 0.5);
  Adam opt({.lr = 0.01});
  auto step = compile_training(loss, {p}, opt);
  VariablePtr count;
  for (const VariablePtr& v : opt.state())
    if (v->name == "optimizer.step") count = v;
  REQUIRE(count != nullptr);
  CHECK(count->value.dtype() == DType::f64);
  const double start = 16777216.0;  // 2^24: f32's t + 1 == t from here
  count->value = Tensor::full({}, start, DType::f64);
  for (int i = 0; i < 3; ++i) step->run({});
  CHECK(count->value.at(0) == start + 3);
  CHECK(std::isfinite(p->value.at(0)));
}

}  // namespace kiln
