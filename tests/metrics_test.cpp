// trainer --metrics: JSON lines with the expected keys and counts; the learning rate the
// schedule gives is the one the optimizer uses.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/safetensors.h"
#include "train/lr_schedule.h"
#include "train/loop.h"

namespace kiln {
namespace {

std::vector<nlohmann::json> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<nlohmann::json> lines;
  std::string text;
  while (std::getline(in, text)) {
    INFO("line " << lines.size() + 1 << ": " << text);
    REQUIRE_NOTHROW(lines.push_back(nlohmann::json::parse(text)));
    REQUIRE(lines.back().is_object());
  }
  return lines;
}

std::set<std::string> keys(const nlohmann::json& line) {
  std::set<std::string> out;
  for (auto it = line.begin(); it != line.end(); ++it) out.insert(it.key());
  return out;
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln-metrics-" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Synthetic data (4096 examples), `batch` per step, `steps` in all.
TrainConfig metrics_run(const std::filesystem::path& metrics, std::int64_t batch,
                        std::int64_t steps) {
  TrainConfig c;
  c.images.synthetic = true;
  c.loop.progress = false;
  c.loop.batch_size = batch;
  c.loop.epochs = 2;
  c.loop.max_steps = steps;
  c.loop.metrics = metrics.string();
  return c;
}

}  // namespace

TEST_CASE(
    "--metrics: a step line every 50 steps and after the last, an epoch line per epoch, all valid "
    "JSON") {
  TempDir dir;
  const TrainConfig c =
      metrics_run(dir.path / "m.jsonl", 64, 70);  // 64 steps per epoch: 70 cross into epoch 2
  const std::vector<EpochReport> results = train(c);
  REQUIRE(results.size() == 2);
  const std::vector<nlohmann::json> lines = read_lines(c.loop.metrics);
  const std::set<std::string> step_keys = {
      "kind", "step", "epoch", "loss", "lr", "examples_per_second", "data_wait_ms"};
  const std::set<std::string> epoch_keys = {
      "kind",          "epoch",     "step",        "loss", "lr", "seconds", "examples_per_second",
      "test_accuracy", "test_loss", "data_wait_ms"};
  std::vector<std::int64_t> steps, epochs;
  for (const nlohmann::json& line : lines) {
    CAPTURE(line.dump());
    if (line["kind"] == "step") {
      CHECK(keys(line) == step_keys);
      steps.push_back(line["step"].get<std::int64_t>());
      CHECK(line["epoch"].get<std::int64_t>() == (steps.back() <= 64 ? 1 : 2));
      CHECK(line["loss"].get<double>() > 0);
      CHECK(line["examples_per_second"].get<double>() > 0);
    } else {
      REQUIRE(line["kind"] == "epoch");
      CHECK(keys(line) == epoch_keys);
      epochs.push_back(line["epoch"].get<std::int64_t>());
      const EpochReport& r = results.at(epochs.size() - 1);
      CHECK(line["step"].get<std::int64_t>() == (r.epoch == 1 ? 64 : 70));
      CHECK(line["loss"].get<double>() == doctest::Approx(r.loss));
      CHECK(line["test_accuracy"].get<double>() == doctest::Approx(r.value("test_accuracy")));
      CHECK(line["test_loss"].get<double>() == doctest::Approx(r.value("test_loss")));
      CHECK(line["test_accuracy"].get<double>() >= 0);
      CHECK(line["test_accuracy"].get<double>() <= 1);
    }
  }
  CHECK(steps == std::vector<std::int64_t>{50, 70});
  CHECK(epochs == std::vector<std::int64_t>{1, 2});
  REQUIRE(lines.size() == 4);
  CHECK(lines[0]["kind"] == "step");  // written as they happen: step 50, epoch 1, step 70, epoch 2
  CHECK(lines[1]["kind"] == "epoch");
  CHECK(lines[2]["kind"] == "step");

  // A second run appends (a resumed run continues the same log): a step line after its last step,
  // an epoch line.
  train(metrics_run(c.loop.metrics, 8, 2));
  const std::vector<nlohmann::json> appended = read_lines(c.loop.metrics);
  REQUIRE(appended.size() == 6);
  CHECK(appended[4]["step"] == 2);
  CHECK(appended[5]["kind"] == "epoch");
}

TEST_CASE(
    "the trainer applies the schedule: warm-up then step decay, in the metrics and in the "
    "optimizer's state") {
  TempDir dir;
  TrainConfig c = metrics_run(dir.path / "lr.jsonl", 8, 60);
  c.loop.lr = 0.01;
  c.loop.lr_schedule = "step";
  c.loop.warmup_steps = 20;
  c.loop.lr_step_size = 10;
  c.loop.lr_gamma = 0.5;
  c.loop.checkpoint = (dir.path / "c.safetensors").string();
  const std::vector<EpochReport> results = train(c);
  auto step_lrs = [](const std::string& path) {
    std::vector<double> lrs;
    for (const nlohmann::json& line : read_lines(path))
      if (line["kind"] == "step") lrs.push_back(line["lr"].get<double>());
    return lrs;
  };
  const std::vector<double> lrs = step_lrs(c.loop.metrics);
  REQUIRE(lrs.size() == 2);
  CHECK(lrs[0] == doctest::Approx(0.01 * 0.25));   // step 50: 29 steps after the warm-up
  CHECK(lrs[1] == doctest::Approx(0.01 * 0.125));  // step 60: 39 steps after
  REQUIRE(results.size() == 1);
  CHECK(results[0].lr == doctest::Approx(lrs[1]));
  // The rate the optimizer read at the last step is the schedule's.
  const SafetensorsFile saved = load_safetensors(c.loop.checkpoint);
  CHECK(saved.tensors.at("state/optimizer.lr").item() == doctest::Approx(lrs[1]).epsilon(1e-6));

  // Stopped during the warm-up: the last step's rate is base * 30 / 40.
  TrainConfig warm = metrics_run(dir.path / "warm.jsonl", 8, 30);
  warm.loop.lr = 0.01;
  warm.loop.lr_schedule = "cosine";
  warm.loop.warmup_steps = 40;
  train(warm);
  const std::vector<double> warm_lrs = step_lrs(warm.loop.metrics);
  REQUIRE(warm_lrs.size() == 1);
  CHECK(warm_lrs[0] == doctest::Approx(0.01 * 30 / 40));
}

TEST_CASE("--metrics into a directory that does not exist fails before training, naming the file") {
  TrainConfig c = metrics_run("/nonexistent/dir/m.jsonl", 8, 2);
  CHECK_THROWS_WITH_AS(train(c),
                       doctest::Contains("--metrics /nonexistent/dir/m.jsonl: cannot open"), Error);
}

}  // namespace kiln
