// fp16 dynamic loss scaling (graph/loss_scale.h) on the CPU: a scale that overflows the f16
// gradients skips the updates (parameters and optimizer state unchanged, never a NaN) and
// halves until the steps go through; clean steps double it every growth_interval; its state
// is the optimizer's, so checkpoints carry it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "backends/compile.h"
#include "core/philox.h"
#include "graph/nn/functional.h"
#include "graph/optim.h"
#include "models/lenet.h"
#include "tests/support.h"

namespace kiln {
namespace {

bool all_finite(const std::vector<VariablePtr>& vars) {
  for (const VariablePtr& v : vars) {
    const Tensor t = v->value.to(DType::f64);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(t.data<double>()[i])) return false;
  }
  return true;
}

bool same_values(const std::vector<Tensor>& a, const std::vector<VariablePtr>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(a[i].raw(), b[i]->value.raw(), a[i].nbytes()) != 0) return false;
  return true;
}

struct Run {
  std::vector<double> loss, scale, skipped;
};

}  // namespace

TEST_CASE("fp16 loss scaling: overflow at 2^30 skips steps, the scale falls, training proceeds") {
  Philox rng(3);
  LeNet model(rng);
  Graph g;
  const Value x = g.input("x", {16, 1, 28, 28});
  const Value y = g.input("y", {16}, DType::i64);
  Sgd sgd({.lr = 0.05, .momentum = 0.9});
  auto program = compile_training(cross_entropy(model(x), y), model.parameters(), sgd,
                                  {.precision = Precision::fp16},
                                  {.loss_scale = LossScaleOptions{.initial = std::ldexp(1.0, 30)}});
  const Tensor images = test::random_tensor({16, 1, 28, 28}, DType::f32, 5, 0.0, 1.0);
  Tensor labels = Tensor::empty({16}, DType::i64);
  for (std::int64_t i = 0; i < 16; ++i) labels.data<std::int64_t>()[i] = (i * 3) % 10;
  std::vector<VariablePtr> watched = model.parameters();
  for (const VariablePtr& v : sgd.state())
    if (v->name.find("momentum") != std::string::npos) watched.push_back(v);
  Run run;
  int skips_seen = 0;
  for (int step = 0; step < 40; ++step) {
    std::vector<Tensor> before;
    for (const VariablePtr& v : watched) before.push_back(v->value.clone());
    const Outputs out = program->run({{x, images}, {y, labels}});
    run.loss.push_back(out.at("loss").item());
    run.scale.push_back(out.at("loss_scale").item());
    run.skipped.push_back(out.at("skipped_steps").item());
    REQUIRE(all_finite(watched));
    const bool skipped = run.skipped.back() > (step == 0 ? 0.0 : run.skipped[step - 1]);
    if (skipped) {
      ++skips_seen;
      CHECK(same_values(before, watched));  // nothing of the update was written
    }
  }
  MESSAGE("skipped " << skips_seen << " steps; scale " << run.scale.front() << " -> "
                     << run.scale.back());
  CHECK(skips_seen >= 3);  // 2^30 overflows f16 gradients for several halvings
  CHECK(run.skipped.back() == skips_seen);
  CHECK(run.scale.back() < run.scale.front());
  CHECK(skips_seen < 30);                           // then the steps go through ...
  CHECK(run.loss.back() < 0.7 * run.loss.front());  // ... and train
}

TEST_CASE("fp16 loss scaling: clean steps double the scale every growth_interval steps") {
  Philox rng(4);
  LeNet model(rng);
  Graph g;
  const Value x = g.input("x", {4, 1, 28, 28});
  const Value y = g.input("y", {4}, DType::i64);
  Sgd sgd({.lr = 0.01});
  auto program = compile_training(
      cross_entropy(model(x), y), model.parameters(), sgd, {.precision = Precision::fp16},
      {.loss_scale = LossScaleOptions{.initial = 8, .growth_interval = 3}});
  const Tensor images = test::random_tensor({4, 1, 28, 28}, DType::f32, 6, 0.0, 1.0);
  Tensor labels = Tensor::zeros({4}, DType::i64);
  std::vector<double> scales;
  for (int step = 0; step < 7; ++step)
    scales.push_back(program->run({{x, images}, {y, labels}}).at("loss_scale").item());
  CHECK(scales == std::vector<double>{8, 8, 8, 16, 16, 16, 32});
  bool found = false;  // the scaler's state is the optimizer's: checkpoints save it
  for (const VariablePtr& v : sgd.state())
    if (v->name == "optimizer.loss_scale") found = v->value.item() == 32;
  CHECK(found);
}

TEST_CASE("compile_training in fp16 turns loss scaling on by itself") {
  Philox rng(5);
  LeNet model(rng);
  Graph g;
  Sgd sgd({.lr = 0.01});
  auto program = compile_training(
      cross_entropy(model(g.input("x", {2, 1, 28, 28})), g.input("y", {2}, DType::i64)),
      model.parameters(), sgd, {.precision = Precision::fp16});
  const Outputs out = program->run({{"x", test::random_tensor({2, 1, 28, 28}, DType::f32, 1)},
                                    {"y", Tensor::zeros({2}, DType::i64)}});
  CHECK(out.at("loss_scale").item() == 65536);
}

}  // namespace kiln
