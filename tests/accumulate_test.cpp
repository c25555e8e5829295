// Gradient accumulation (TrainStepOptions::accumulate): N runs on micro-batches update as one
// run on their examples together, in f64 to 1e-12, with SGD (momentum, weight decay), Adam,
// AdamW and clipping; the runs between updates change nothing but the accumulators; and with
// loss scaling a non-finite micro-batch skips its whole update and the next one starts clean.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backends/compile.h"
#include "graph/nn/functional.h"
#include "graph/ops.h"
#include "graph/optim.h"
#include "tests/support.h"

namespace kiln {
namespace {

// A two-layer regression over [rows, 3] -> [rows, 2] whose loss is the mean over its rows, so
// that the mean of two half batches' gradients is the whole batch's.
struct Mlp {
  VariablePtr w1 = make_variable("w1", test::random_tensor({5, 3}, DType::f64, 1, -1, 1));
  VariablePtr b1 = make_variable("b1", test::random_tensor({5}, DType::f64, 2, -1, 1));
  VariablePtr w2 = make_variable("w2", test::random_tensor({2, 5}, DType::f64, 3, -1, 1));

  std::vector<VariablePtr> params() const { return {w1, b1, w2}; }

  std::unique_ptr<Program> step(std::int64_t rows, Optimizer& opt,
                                const TrainStepOptions& options) {
    graph = std::make_unique<Graph>();
    Graph& g = *graph;
    const Value x = g.input("x", {rows, 3}, DType::f64), y = g.input("y", {rows, 2}, DType::f64);
    const Value h = tanh(matmul(x, g.variable(w1), false, true) + g.variable(b1));
    const Value r = matmul(h, g.variable(w2), false, true) - y;
    return compile_training(mean_all(r * r), params(), opt, {}, options);
  }

  std::vector<double> values() const {
    std::vector<double> out;
    for (const VariablePtr& p : params())
      for (double v : p->value.to_doubles()) out.push_back(v);
    return out;
  }

  std::unique_ptr<Graph> graph;
};

std::unique_ptr<Optimizer> optimizer(const std::string& kind) {
  if (kind == "sgd")
    return std::make_unique<Sgd>(SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  return std::make_unique<Adam>(AdamOptions{.lr = 0.01,
                                            .weight_decay = kind == "adamw" ? 0.1 : 0.0,
                                            .decoupled_weight_decay = kind == "adamw"});
}

// Rows [first, first + count) of the step's [8, ...] batch `step`.
Tensor rows_of(const Tensor& t, std::int64_t first, std::int64_t count) {
  const std::int64_t width = t.shape()[1];
  std::vector<double> all = t.to_doubles();
  return Tensor::from_vector<double>(
      {count, width},
      std::vector<double>(all.begin() + first * width, all.begin() + (first + count) * width));
}

TEST_CASE("accumulating 2 micro-batches of 4 updates as one batch of 8, and not in between") {
  for (const char* kind : {"sgd", "adam", "adamw"})
    for (double clip : {0.0, 0.5}) {
      CAPTURE(kind);
      CAPTURE(clip);
      Mlp whole, parts;
      const std::unique_ptr<Optimizer> whole_opt = optimizer(kind), parts_opt = optimizer(kind);
      const std::unique_ptr<Program> one = whole.step(8, *whole_opt, {.clip_grad_norm = clip});
      const std::unique_ptr<Program> micro =
          parts.step(4, *parts_opt, {.clip_grad_norm = clip, .accumulate = 2});
      for (std::uint64_t step = 0; step < 3; ++step) {
        const Tensor x = test::random_tensor({8, 3}, DType::f64, 10 + step, -2, 2);
        const Tensor y = test::random_tensor({8, 2}, DType::f64, 20 + step, -1, 1);
        const Outputs want = one->run({{"x", x}, {"y", y}});
        const std::vector<double> before = parts.values();
        const Outputs first = micro->run({{"x", rows_of(x, 0, 4)}, {"y", rows_of(y, 0, 4)}});
        CHECK(parts.values() == before);  // the first micro-batch only accumulates
        const Outputs second = micro->run({{"x", rows_of(x, 4, 4)}, {"y", rows_of(y, 4, 4)}});
        // Each run's loss is its micro-batch's; their mean is the whole batch's.
        CHECK((first.at("loss").item() + second.at("loss").item()) / 2 ==
              doctest::Approx(want.at("loss").item()).epsilon(1e-12));
        const std::vector<double> got = parts.values(), expected = whole.values();
        REQUIRE(got.size() == expected.size());
        for (std::size_t i = 0; i < got.size(); ++i) {
          CAPTURE(i);
          CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
        }
      }
      // The optimizer states (moments, step counts) agree as well.
      const std::vector<VariablePtr> a = whole_opt->state(), b = parts_opt->state();
      REQUIRE(a.size() == b.size());
      for (std::size_t v = 0; v < a.size(); ++v)
        for (std::int64_t i = 0; i < a[v]->value.numel(); ++i)
          CHECK(b[v]->value.at(i) == doctest::Approx(a[v]->value.at(i)).epsilon(1e-12));
    }
}

TEST_CASE("accumulating with loss scaling: a non-finite micro-batch skips its whole update") {
  Mlp whole, parts;
  Sgd whole_opt({.lr = 0.05, .momentum = 0.9}), parts_opt({.lr = 0.05, .momentum = 0.9});
  const LossScaleOptions scale{.initial = 1024};
  const std::unique_ptr<Program> one = whole.step(8, whole_opt, {.loss_scale = scale});
  const std::unique_ptr<Program> micro =
      parts.step(4, parts_opt, {.loss_scale = scale, .accumulate = 2});
  const Tensor x = test::random_tensor({8, 3}, DType::f64, 31, -2, 2);
  const Tensor y = test::random_tensor({8, 2}, DType::f64, 32, -1, 1);
  Tensor bad = rows_of(y, 4, 4);
  bad.data<double>()[3] = std::numeric_limits<double>::infinity();
  const std::vector<double> before = parts.values();
  micro->run({{"x", rows_of(x, 0, 4)}, {"y", rows_of(y, 0, 4)}});
  const Outputs skipped = micro->run({{"x", rows_of(x, 4, 4)}, {"y", bad}});
  CHECK(parts.values() == before);
  CHECK(skipped.at("skipped_steps").item() == 1);
  CHECK(skipped.at("loss_scale").item() == 1024);  // the scale this run used
  // The next two micro-batches update from empty accumulators, as one clean step would (at
  // the backed-off scale, which the unscaled gradients do not depend on).
  const Outputs want = one->run({{"x", x}, {"y", y}});
  micro->run({{"x", rows_of(x, 0, 4)}, {"y", rows_of(y, 0, 4)}});
  const Outputs done = micro->run({{"x", rows_of(x, 4, 4)}, {"y", rows_of(y, 4, 4)}});
  CHECK(done.at("skipped_steps").item() == 1);
  CHECK(done.at("loss_scale").item() == 512);  // backed off once, for the whole skipped update
  const std::vector<double> got = parts.values(), expected = whole.values();
  for (std::size_t i = 0; i < got.size(); ++i) {
    CAPTURE(i);
    CHECK(got[i] == doctest::Approx(expected[i]).epsilon(1e-12));
  }
}

TEST_CASE("accumulate below 1 is refused when the step is recorded") {
  Mlp m;
  Sgd opt({});
  CHECK_THROWS_WITH_AS(m.step(4, opt, {.accumulate = 0}),
                       doctest::Contains("accumulate must be >= 1"), Error);
}

}  // namespace
}  // namespace kiln
