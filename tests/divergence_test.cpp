// Divergence detection of the one training loop: a non-finite or exploded loss, a
// non-finite evaluation or state stops the run naming the step, and no checkpoint holding a
// NaN or Inf is ever written.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <limits>

#include "graph/graph.h"
#include "train/divergence.h"
#include "train/loop.h"

namespace kiln {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TaskState state_with(const std::string& name, float value) {
  Tensor t = Tensor::zeros({2, 3}, DType::f32);
  t.data<float>()[4] = value;
  return {.parameters = {make_variable("fc.weight", Tensor::zeros({3}, DType::f32), true)},
          .optimizer_state = {make_variable(name, t, false)}};
}

}  // namespace

TEST_CASE("divergence: a non-finite loss or value names the epoch and the step") {
  DivergenceCheck check;
  CHECK_NOTHROW(check.check_step({.loss = 2.3}, 1, 1));
  CHECK_THROWS_WITH_AS(check.check_step({.loss = kNaN}, 1, 2),
                       doctest::Contains("training diverged: loss is nan at epoch 1 step 2"),
                       Error);
  CHECK_THROWS_WITH_AS(check.check_step({.loss = 1.0, .extras = {{"g_loss", kInf}}}, 2, 7),
                       doctest::Contains("loss is 1, g_loss inf at epoch 2 step 7"), Error);
}

TEST_CASE("divergence: a loss far beyond the first step's is an explosion") {
  DivergenceCheck check;
  check.check_step({.loss = 2.5}, 1, 1);
  CHECK_NOTHROW(check.check_step({.loss = 2.5e4}, 1, 2));  // 10^4 x the first: still allowed
  CHECK_THROWS_WITH_AS(check.check_step({.loss = 5.9e30}, 1, 3),
                       doctest::Contains("training diverged: loss is 5.9e+30 at epoch 1 step 3, "
                                         "more than 10000 times the first step's 2.5"),
                       Error);
  DivergenceCheck small;  // a first loss below 1 is measured against 1
  small.check_step({.loss = 1e-3}, 1, 1);
  CHECK_NOTHROW(small.check_step({.loss = 9e3}, 1, 2));
  CHECK_THROWS_AS(small.check_step({.loss = 2e4}, 1, 3), Error);
}

TEST_CASE("divergence: a non-finite evaluation or state is named") {
  CHECK_THROWS_WITH_AS(
      DivergenceCheck::check_evaluation({{"test_accuracy", 0.1}, {"test_loss", kNaN}}, 3),
      doctest::Contains("training diverged: test_loss is nan after epoch 3"), Error);
  CHECK_NOTHROW(DivergenceCheck::check_state(state_with("optimizer.fc.weight.v", 1.0f), "", ""));
  CHECK_THROWS_WITH_AS(
      DivergenceCheck::check_state(state_with("optimizer.fc.weight.v", INFINITY),
                                   "after step 12 of the run",
                                   ": the checkpoint c was not written"),
      doctest::Contains("training diverged: optimizer.fc.weight.v holds inf (element 4 of "
                        "[2, 3]) after step 12 of the run: the checkpoint c was not written"),
      Error);
}

TEST_CASE("divergence: an exploding run stops naming the step and writes no checkpoint") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kiln-divergence-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainConfig c;
  c.images.synthetic = true;
  c.loop.progress = false;
  c.loop.epochs = 1;
  c.loop.max_steps = 20;
  c.loop.lr = 1e6;  // Adam: the loss passes 10^30 within a few steps
  c.loop.checkpoint = (dir / "c.safetensors").string();
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("training diverged: loss is"), Error);
  CHECK_THROWS_WITH_AS(train(c), doctest::Contains("at epoch 1 step 2, more than 10000 times"),
                       Error);
  CHECK_FALSE(std::filesystem::exists(c.loop.checkpoint));
  std::filesystem::remove_all(dir);
}

}  // namespace kiln
