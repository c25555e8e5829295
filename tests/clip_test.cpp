// Gradient clipping by global norm: the clipped SGD update against one computed by hand
// (f64), and an unchanged step when the norm is below the threshold.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/compile.h"
#include "graph/ops.h"
#include "graph/nn/functional.h"
#include "train/step_graph.h"
#include "train/loop.h"
#include "tests/support.h"

namespace kiln {
namespace {

// Linear regression, loss = mean((x w^T + b - y)^2) over [4, 2]; its gradients are easy to
// write down: r = x w^T + b - y, dw = 2/8 r^T x, db = 2/8 sum_rows(r).
struct Regression {
  std::vector<double> x = {0.5,  -1.0, 2.0,  1.5, 0.25, -0.5,
                           -2.0, 1.0,  0.75, 3.0, -1.5, 0.5};          // [4, 3]
  std::vector<double> y = {1.0, -2.0, 0.5, 3.0, -1.0, 2.5, 4.0, 0.0};  // [4, 2]
  VariablePtr w =
      make_variable("w", Tensor::from_vector<double>({2, 3}, {0.3, -0.2, 0.8, 1.1, 0.4, -0.6}));
  VariablePtr b = make_variable("b", Tensor::from_vector<double>({2}, {0.1, -0.3}));
  Graph graph;

  std::unique_ptr<Program> step(Optimizer& opt, const TrainStepOptions& options) {
    const Value xv = graph.constant(Tensor::from_vector<double>({4, 3}, x));
    const Value yv = graph.constant(Tensor::from_vector<double>({4, 2}, y));
    const Value r = matmul(xv, graph.variable(w), false, true) + graph.variable(b) - yv;
    return compile_training(mean_all(r * r), {w, b}, opt, {}, options);
  }

  // Gradients by hand: dw (6 values) then db (2 values).
  std::vector<double> gradients() const {
    std::vector<double> r(8), out(8, 0.0);
    for (int i = 0; i < 4; ++i)
      for (int o = 0; o < 2; ++o) {
        double v = b->value.at(o) - y[i * 2 + o];
        for (int k = 0; k < 3; ++k) v += x[i * 3 + k] * w->value.at(o * 3 + k);
        r[i * 2 + o] = v;
      }
    for (int i = 0; i < 4; ++i)
      for (int o = 0; o < 2; ++o) {
        for (int k = 0; k < 3; ++k) out[o * 3 + k] += 2.0 / 8 * r[i * 2 + o] * x[i * 3 + k];
        out[6 + o] += 2.0 / 8 * r[i * 2 + o];
      }
    return out;
  }

  std::vector<double> params() const {
    std::vector<double> p = w->value.to_doubles(), pb = b->value.to_doubles();
    p.insert(p.end(), pb.begin(), pb.end());
    return p;
  }
};

}  // namespace

TEST_CASE("clip_grad_norm: the clipped SGD update equals the one computed by hand (f64)") {
  for (double clip : {0.5, 2.0}) {
    CAPTURE(clip);
    Regression m;
    Sgd opt({.lr = 0.1});
    auto step = m.step(opt, {.clip_grad_norm = clip});
    for (int s = 0; s < 3; ++s) {
      CAPTURE(s);
      const std::vector<double> g = m.gradients(), before = m.params();
      double norm = 0;
      for (double v : g) norm += v * v;
      norm = std::sqrt(norm);
      REQUIRE(norm > clip);  // the case under test: clipping is active
      const double scale = std::min(1.0, clip / (norm + 1e-6));
      const Outputs out = step->run({});
      CHECK(out.at("grad_norm").item() == doctest::Approx(norm).epsilon(1e-12));
      const std::vector<double> after = m.params();
      double update_norm = 0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        CHECK(after[i] == doctest::Approx(before[i] - 0.1 * scale * g[i]).epsilon(1e-12));
        update_norm += (after[i] - before[i]) * (after[i] - before[i]);
      }
      CHECK(std::sqrt(update_norm) ==
            doctest::Approx(0.1 * clip).epsilon(1e-6));  // the step has the clipped length
    }
  }
}

TEST_CASE("clip_grad_norm: below the threshold the step is exactly the unclipped one") {
  Regression clipped, plain;
  Sgd opt_a({.lr = 0.05, .momentum = 0.9}), opt_b({.lr = 0.05, .momentum = 0.9});
  auto a = clipped.step(opt_a, {.clip_grad_norm = 1e6});
  auto b = plain.step(opt_b, {});
  for (int s = 0; s < 4; ++s) {
    const Outputs out = a->run({});
    b->run({});
    CHECK(out.at("grad_norm").item() < 1e6);
    const std::vector<double> pa = clipped.params(), pb = plain.params();
    CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(double)) == 0);
  }
  CHECK(b->graph().output_ref("loss").node >= 0);
  CHECK_THROWS_WITH_AS(b->graph().output_ref("grad_norm"), doctest::Contains("grad_norm"),
                       Error);  // only when clipping
}

TEST_CASE("clip_grad_norm: bad thresholds and mixed dtypes are errors") {
  Regression m;
  Sgd opt({.lr = 0.1});
  CHECK_THROWS_WITH_AS(m.step(opt, {.clip_grad_norm = -1}),
                       doctest::Contains("clip_grad_norm must be >= 0 (got -1)"), Error);
  Graph g;
  const Value a = g.input("a", {2}, DType::f32), b = g.input("b", {2}, DType::f64);
  CHECK_THROWS_WITH_AS(clip_by_global_norm({a, b}, 1.0), doctest::Contains("dtypes f32 and f64"),
                       Error);
  CHECK_THROWS_WITH_AS(clip_by_global_norm({a}, 0.0), doctest::Contains("must be positive (got 0)"),
                       Error);
}

namespace {

// The parameters of LeNet after `steps` SGD steps (lr 0.1) on fixed random batches of 16.
std::vector<Tensor> lenet_after(int steps, double clip, std::vector<Tensor>* before = nullptr) {
  ModelGraph m =
      build_model_graph("lenet", Stage::train, 16, {.name = "sgd", .lr = 0.1, .momentum = 0}, 5,
                        {.clip_grad_norm = clip});
  if (before != nullptr)
    for (const VariablePtr& p : m.model->parameters()) before->push_back(p->value.clone());
  auto step = compile(*m.graph);
  std::vector<std::int64_t> labels(16);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>(i * 7 % 10);
  for (int s = 0; s < steps; ++s)
    step->run({{"x", test::random_tensor({16, 1, 28, 28}, DType::f32,
                                         70 + static_cast<std::uint64_t>(s))},
               {"y", Tensor::from_vector<std::int64_t>({16}, labels)}});
  std::vector<Tensor> out;
  for (const VariablePtr& p : m.model->parameters()) out.push_back(p->value.clone());
  return out;
}

}  // namespace

TEST_CASE(
    "clip_grad_norm on LeNet (f32, fused): a tiny threshold makes the SGD step exactly lr times "
    "clip long, a huge one changes nothing") {
  std::vector<Tensor> before;
  const std::vector<Tensor> clipped = lenet_after(1, 1e-2, &before);
  double update = 0;
  for (std::size_t i = 0; i < before.size(); ++i)
    for (std::int64_t k = 0; k < before[i].numel(); ++k)
      update += std::pow(clipped[i].at(k) - before[i].at(k), 2);
  CHECK(std::sqrt(update) == doctest::Approx(0.1 * 1e-2).epsilon(1e-3));

  const std::vector<Tensor> plain = lenet_after(3, 0), loose = lenet_after(3, 1e9);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(plain[i].raw(), loose[i].raw(), plain[i].nbytes()) == 0);
  }
}

TEST_CASE(
    "TrainConfig.clip_grad_norm reaches the trainer's step: a tiny threshold changes the run, a "
    "huge one does not") {
  auto final_params = [](double clip) {
    TrainConfig c;
    c.images.synthetic = true;
    c.loop.progress = false;
    c.loop.batch_size = 8;
    c.loop.max_steps = 3;
    c.loop.optimizer = "sgd";
    c.loop.lr = 0.05;
    c.loop.clip_grad_norm = clip;
    std::vector<Tensor> out;
    train(c, {}, [&](const TaskState& state) {
      const std::vector<VariablePtr>& p = state.parameters;
      for (const VariablePtr& v : p) out.push_back(v->value.clone());
    });
    return out;
  };
  const std::vector<Tensor> plain = final_params(0), loose = final_params(1e9),
                            tight = final_params(1e-3);
  bool all_equal = true, any_differs = false;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    all_equal = all_equal && std::memcmp(plain[i].raw(), loose[i].raw(), plain[i].nbytes()) == 0;
    any_differs =
        any_differs || std::memcmp(plain[i].raw(), tight[i].raw(), plain[i].nbytes()) != 0;
  }
  CHECK(all_equal);
  CHECK(any_differs);
}

}  // namespace kiln
