// dump: shows a model's graph before and after fusion, the fused kernels and their CUDA
// source.   dump --model lenet --stage train --format text|dot|json [--kernels]
// Exit codes: 0 done, 1 an error, 2 a bad flag.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fstream>
#include <iostream>

#include "models/gan.h"
#include "train/gan_steps.h"
#include "models/registry.h"
#include "train/step_graph.h"
#include "train/train_lm.h"
#include "tools/graph_render.h"
#include "tools/cli.h"

int main(int argc, char** argv) {
  std::string model = "lenet", stage = "train", format = "text", optimizer = "sgd", output;
  std::int64_t batch = 64;
  bool kernels = false;
  std::vector<std::string> models;
  for (const kiln::ModelInfo& m : kiln::model_infos()) models.push_back(m.name);

  CLI::App app{"kiln dump: a model's graph before and after fusion, with the generated kernels"};
  app.add_option("--model", model, "model")->check(CLI::IsMember(models))->capture_default_str();
  app.add_option("--stage", stage,
                 "forward (inference) or train (forward, backward, optimizer); GANs: discriminator "
                 "or generator (their two steps)")
      ->check(CLI::IsMember({"forward", "train", "discriminator", "generator"}))
      ->capture_default_str();
  app.add_option("--format", format, "text, dot (Graphviz) or json")
      ->check(CLI::IsMember({"text", "dot", "json"}))
      ->capture_default_str();
  app.add_flag("--kernels", kernels, "include each fused kernel's generated CUDA source");
  app.add_option("--batch-size", batch, "batch size")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--optimizer", optimizer, "sgd, adam or adamw (train stage)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("-o,--output", output, "write here instead of standard output");
  std::string device = "cpu";
  app.add_option(
         "--device", device,
         "cuda: also compile every kernel for the GPU and show registers, spills and occupancy")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;

  try {
    std::unique_ptr<kiln::Graph> graph;
    const kiln::ModelTask task = kiln::model_info(model).task;
    if (task == kiln::ModelTask::gan) {  // GAN defaults: the discriminator step, Adam
      if (app.count("--stage") == 0) stage = "discriminator";
      if (app.count("--optimizer") == 0) optimizer = "adam";
    }
    KILN_CHECK((task == kiln::ModelTask::gan) == (stage == "discriminator" || stage == "generator"),
               "--stage {}: {} has the stages {}", stage, model,
               task == kiln::ModelTask::gan ? "discriminator and generator" : "forward and train");
    std::unique_ptr<kiln::Gan> gan;  // owns the variables the GAN graph reads
    std::unique_ptr<kiln::Optimizer> gan_optimizer;
    if (task == kiln::ModelTask::gan) {
      kiln::Philox rng(0);
      gan = kiln::make_gan(model, rng);
      gan_optimizer = kiln::make_optimizer({.name = optimizer, .lr = 2e-4, .beta1 = 0.5});
      graph = std::make_unique<kiln::Graph>();
      if (stage == "discriminator")
        kiln::record_discriminator_step(*graph, *gan, batch, *gan_optimizer);
      else
        kiln::record_generator_step(*graph, *gan, batch, *gan_optimizer);
    } else if (task == kiln::ModelTask::language_model) {
      kiln::TrainConfig config;  // char-lstm at its defaults (sequence 64)
      config.batch_size = batch;
      config.optimizer = optimizer;
      graph = kiln::char_lstm_graph(config, stage == "train");
    } else {
      graph = std::move(kiln::build_model_graph(
                            model, stage == "train" ? kiln::Stage::train : kiln::Stage::forward,
                            batch, {.name = optimizer, .lr = 0.01})
                            .graph);
    }
    kiln::tools::FusionView view = kiln::tools::fuse_for_view(*graph);
    if (device == "cuda") kiln::tools::add_occupancy(view);
    const std::string title = fmt::format("{} {} step, batch {}{}", model, stage, batch,
                                          stage == "forward" ? "" : ", " + optimizer);
    std::string text;
    if (format == "text") text = kiln::tools::render_text(view, title, kernels);
    if (format == "dot") text = kiln::tools::render_dot(view, title);
    if (format == "json") {
      nlohmann::json j = kiln::tools::render_json(view, kernels);
      j["title"] = title;
      text = j.dump(2) + "\n";
    }
    if (output.empty()) {
      std::cout << text;
      return 0;
    }
    std::ofstream out(output);
    if (!out || !(out << text)) throw kiln::Error(fmt::format("{}: cannot write", output));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dump: error: {}\n", e.what());
    return 1;
  }
}
