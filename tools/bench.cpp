// bench: times training steps (warm-up, then the median of many) and prints a table;
// --json writes the figures. The speed targets of the issues are checked with this tool.
//   bench --model lenet --batch-size 64 --steps 100
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/compile.h"
#include "graph/nn/functional.h"
#include "models/dataset.h"
#include "models/registry.h"

namespace {

struct StepTimes {
  double median_ms, p10_ms, p90_ms;
};

StepTimes summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[static_cast<std::size_t>(q * static_cast<double>(ms.size() - 1))]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// Times `steps` training steps of `model` at `batch` on random data, after `warmup` steps.
nlohmann::json bench_training_step(const std::string& model_name, std::int64_t batch, int warmup, int steps) {
  const kiln::ModelInfo& info = kiln::model_info(model_name);
  kiln::Philox rng(0);
  auto model = kiln::make_model(model_name, rng);
  kiln::Sgd sgd({.lr = 0.01, .momentum = 0.9});
  kiln::Graph g;
  std::vector<std::int64_t> dims = {batch};
  dims.insert(dims.end(), info.input_shape.dims().begin(), info.input_shape.dims().end());
  const kiln::Value x = g.input("x", kiln::Shape(dims));
  const kiln::Value y = g.input("y", {batch}, kiln::DType::i64);
  const auto compile_start = std::chrono::steady_clock::now();
  auto step = kiln::compile_training(kiln::cross_entropy((*model)(x), y), model->parameters(), sgd);
  const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - compile_start).count();
  const kiln::Dataset data = kiln::synthetic_images(batch, info.input_shape, info.classes, 1);

  std::vector<double> ms;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step->run({{"x", data.images}, {"y", data.labels}});
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (i >= warmup) ms.push_back(elapsed);
  }
  const StepTimes t = summarise(ms);
  return {{"name", fmt::format("{} training step, batch {}, SGD momentum", model_name, batch)},
          {"model", model_name},
          {"batch", batch},
          {"device", "cpu"},
          {"threads", omp_get_max_threads()},
          {"steps", steps},
          {"median_ms", t.median_ms},
          {"p10_ms", t.p10_ms},
          {"p90_ms", t.p90_ms},
          {"images_per_second", static_cast<double>(batch) * 1000.0 / t.median_ms},
          {"compile_ms", compile_ms},
          {"planned_bytes", step->planned_bytes()}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "lenet";
  std::vector<std::int64_t> batches = {64};
  int warmup = 5, steps = 50, threads = 0;
  std::string json_path;
  CLI::App app{"kiln bench: times training steps on the CPU"};
  app.add_option("--model", model, "model")->capture_default_str();
  app.add_option("--batch-size", batches, "batch sizes (several allowed)")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed steps first")->capture_default_str();
  app.add_option("--steps", steps, "timed steps")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)");
  app.add_option("--json", json_path, "write the results as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (threads > 0) omp_set_num_threads(threads);
    nlohmann::json results = nlohmann::json::array();
    fmt::print("{:<48} {:>10} {:>10} {:>10} {:>12}\n", "benchmark", "median ms", "p10 ms", "p90 ms", "images/s");
    for (std::int64_t batch : batches) {
      nlohmann::json r = bench_training_step(model, batch, warmup, steps);
      fmt::print("{:<48} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.0f}\n", r["name"].get<std::string>(), r["median_ms"].get<double>(),
                 r["p10_ms"].get<double>(), r["p90_ms"].get<double>(), r["images_per_second"].get<double>());
      results.push_back(r);
    }
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      if (!out) throw kiln::Error(fmt::format("{}: cannot open for writing", json_path));
      out << results.dump(2) << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench: error: {}\n", e.what());
    return 1;
  }
}
