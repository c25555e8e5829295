// The training loop end to end: LeNet learns real Fashion-MNIST; runs are reproducible.
#include <doctest/doctest.h>

#include <omp.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "data/dataset.h"
#include "train/loop.h"

namespace kiln {
namespace {

// A quick run on synthetic data, without a progress bar.
TrainConfig synthetic_run() {
  TrainConfig config;
  config.images.synthetic = true;
  config.loop.progress = false;
  return config;
}

// A run that diverges: SGD at a huge constant learning rate.
TrainConfig diverging_run(double lr) {
  TrainConfig config = synthetic_run();
  config.loop.optimizer = "sgd";
  config.loop.lr = lr;
  config.loop.lr_schedule = "constant";
  config.loop.max_steps = 50;
  return config;
}

}  // namespace

TEST_CASE("LeNet learns Fashion-MNIST: 300 Adam steps reach 80% test accuracy") {
  if (!std::filesystem::exists(kFashionMnistDir)) {
    MESSAGE("skipped: Fashion-MNIST is not installed at " << kFashionMnistDir);
    return;
  }
  TrainConfig config;
  config.loop.epochs = 1;
  config.loop.max_steps = 300;
  config.loop.progress = false;
  const std::vector<EpochReport> results = train(config);
  REQUIRE(results.size() == 1);
  MESSAGE("accuracy after 300 steps: " << results[0].value("test_accuracy") << ", loss "
                                       << results[0].loss);
  CHECK(results[0].steps == 300);
  CHECK(results[0].loss < 0.9);
  CHECK(results[0].value("test_accuracy") >= 0.80);
}

TEST_CASE("the same seed gives the same run, another seed a different one") {
  TrainConfig config;
  config.images.synthetic = true;
  config.loop.epochs = 2;
  config.loop.max_steps = 40;
  config.loop.progress = false;
  const auto a = train(config);
  const auto b = train(config);
  config.loop.seed = 1;
  const auto c = train(config);
  REQUIRE(a.size() == 1);  // 4096 synthetic examples: 64 steps per epoch, stopped at 40
  CHECK(a[0].loss == b[0].loss);
  CHECK(a[0].value("test_accuracy") == b[0].value("test_accuracy"));
  CHECK(a[0].loss != c[0].loss);
}

TEST_CASE("bad training settings are rejected with the value in the message") {
  TrainConfig config = synthetic_run();
  config.model = "resnet9000";
  CHECK_THROWS_WITH_AS(train(config), doctest::Contains("unknown model 'resnet9000'"), Error);
  config.model = "lenet";
  config.loop.optimizer = "rmsprop";
  CHECK_THROWS_WITH_AS(train(config), doctest::Contains("--optimizer is 'rmsprop'"), Error);
  config.loop.optimizer = "sgd";
  config.loop.batch_size = 100000;
  CHECK_THROWS_WITH_AS(train(config), doctest::Contains("batch size 100000 is larger"), Error);
}

TEST_CASE("a diverging run stops with the step where the loss became non-finite") {
  TrainConfig config = diverging_run(1e6);
  CHECK_THROWS_WITH_AS(train(config), doctest::Contains("training diverged"), Error);
}

TEST_CASE(
    "--check-numerics stops a diverging run at the op that overflowed, with the step and input "
    "ranges") {
  TrainConfig config = diverging_run(1e12);
  config.device.check_numerics = true;
  try {
    train(config);
    FAIL("the run should have stopped");
  } catch (const Error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(message.find("epoch 1 step ") == 0);
    CHECK(message.find("check-numerics: run ") != std::string::npos);
    CHECK(message.find("produced ") != std::string::npos);
    CHECK(message.find("range [") != std::string::npos);    // the inputs' ranges
    CHECK(message.find("op 'fused") == std::string::npos);  // a single op is named, not a group
  }
}

}  // namespace kiln

namespace kiln {
namespace {

void check_same_bits_for_any_thread_count(bool deterministic) {
  std::vector<std::vector<Tensor>> params;
  for (int threads : {1, 2, 5}) {
    omp_set_num_threads(threads);
    TrainConfig config;
    config.device.deterministic = deterministic;
    config.images.synthetic = true;
    config.loop.progress = false;
    config.loop.max_steps = 5;
    config.loop.epochs = 1;
    std::vector<Tensor> snapshot;
    train(config, {}, [&](const TaskState& state) {
      const std::vector<VariablePtr>& p = state.parameters;
      for (const VariablePtr& v : p) snapshot.push_back(v->value.clone());
    });
    params.push_back(snapshot);
  }
  omp_set_num_threads(omp_get_num_procs());
  for (std::size_t run = 1; run < params.size(); ++run)
    for (std::size_t i = 0; i < params[0].size(); ++i) {
      CAPTURE(run);
      CAPTURE(i);
      CHECK(std::memcmp(params[0][i].raw(), params[run][i].raw(), params[0][i].nbytes()) == 0);
    }
}

}  // namespace

// --deterministic promises it (kiln's own convolutions); the default (oneDNN's float32
// convolutions) has given the same bits too on every machine measured, which this checks.
TEST_CASE("the CPU training step gives the same bits for any number of threads") {
  for (const bool deterministic : {true, false}) {
    CAPTURE(deterministic);
    check_same_bits_for_any_thread_count(deterministic);
  }
}

}  // namespace kiln

namespace kiln {

TEST_CASE("save at step N, resume, train to 2N: the same bits as an uninterrupted run") {
  // One directory per process: the same test may run beside this one (another checkout's ctest).
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-resume-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainConfig base;
  base.images.synthetic = true;
  base.loop.progress = false;
  base.loop.epochs = 2;
  base.loop.optimizer = "adam";
  base.loop.lr_schedule =
      "constant";  // the first run stops early by max_steps, which sets a cosine's horizon
  auto final_params = [](const TrainConfig& c) {
    std::vector<Tensor> out;
    train(c, {}, [&](const TaskState& state) {
      const std::vector<VariablePtr>& p = state.parameters;
      for (const VariablePtr& v : p) out.push_back(v->value.clone());
    });
    return out;
  };
  TrainConfig whole = base;
  whole.loop.max_steps = 90;  // crosses the epoch boundary (64 steps per epoch)
  const std::vector<Tensor> uninterrupted = final_params(whole);

  TrainConfig first = base;
  first.loop.max_steps = 45;
  first.loop.checkpoint = (dir / "half.safetensors").string();
  final_params(first);
  TrainConfig second = whole;
  second.loop.resume = first.loop.checkpoint;
  const std::vector<Tensor> resumed = final_params(second);
  REQUIRE(resumed.size() == uninterrupted.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(resumed[i].raw(), uninterrupted[i].raw(), resumed[i].nbytes()) == 0);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("resuming from a checkpoint of another model is a clear error and changes nothing") {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-resume-bad-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  TrainConfig c;
  c.images.synthetic = true;
  c.loop.progress = false;
  c.loop.max_steps = 2;
  c.loop.optimizer = "sgd";
  c.loop.checkpoint = (dir / "sgd.safetensors").string();
  train(c);
  TrainConfig other = c;
  other.loop.optimizer = "adam";  // Adam's state (m, v, step) is not in an SGD checkpoint
  other.loop.checkpoint.clear();
  other.loop.resume = c.loop.checkpoint;
  CHECK_THROWS_WITH_AS(train(other), doctest::Contains("has no tensor 'state/optimizer."), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace kiln
