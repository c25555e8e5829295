// dump's command line (tools/tool_main.h): a model's graph before and after fusion, the fused
// kernels and their CUDA source.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <span>
#include <iostream>

#include "core/atomic_file.h"
#include "gpu/cuda_runtime.h"
#include "tools/graph_render.h"
#include "tools/cli.h"
#include "tools/output_check.h"
#include "tools/tool_main.h"
#include "train/tasks.h"

namespace {

int run(int argc, char** argv) {
  std::string model = "lenet", stage = "train", format = "text", optimizer, output;
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
  app.add_option("--optimizer", optimizer,
                 "sgd, adam or adamw (train stage; default: the trainer's)")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  app.add_option("-o,--output", output, "write here instead of standard output");
  std::string device = "cpu";
  app.add_option(
         "--device", device,
         "cuda: also compile every kernel for the GPU and show registers, spills and occupancy")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  std::string precision = "fp32";
  app.add_option("--precision", precision,
                 "fp32, tf32, bf16 or fp16: the step as compile() rewrites it (bf16/fp16: the "
                 "autocast pass; every value shows its dtype)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}))
      ->capture_default_str();
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;

  try {
    const kiln::TaskEntry& task = kiln::task_entry(model);  // its step graphs, by stage
    if (app.count("--stage") == 0) stage = task.stages.front();
    KILN_CHECK(std::find(task.stages.begin(), task.stages.end(), stage) != task.stages.end(),
               "--stage {}: {} has the stages {}", stage, model, fmt::join(task.stages, " and "));
    kiln::TrainConfig config;  // the trainer's settings at its defaults
    config.model = model;
    config.loop.batch_size = batch;
    if (task.apply_defaults) task.apply_defaults(config, {});
    if (!optimizer.empty()) config.loop.optimizer = optimizer;
    optimizer = config.loop.optimizer;
    // Without a GPU the view is planned for an sm_90 of 132 SMs (an H100 or H200): the layout,
    // the convolution passes and their tiles as they are chosen there.
    std::string planned;
#ifdef KILN_HAVE_CUDA
    if (kiln::gpu::cuda_device_count() == 0) {
      kiln::gpu::assume_plan_target(90, 132);
      planned = ", GPU choices for an sm_90 of 132 SMs (no GPU here)";
    }
#endif
    const kiln::RecordedStep recorded = task.record(config, stage);
    const kiln::Graph* graph = recorded.graph.get();
    kiln::tools::FusionView view =
        kiln::tools::fuse_for_view(*graph, *kiln::precision_from_name(precision));
    if (device == "cuda") kiln::tools::add_occupancy(view);
    const std::string title =
        fmt::format("{} {} step, batch {}{}{}{}", model, stage, batch,
                    stage == "forward" ? "" : ", " + optimizer,
                    precision == "fp32" ? "" : ", precision " + precision, planned);
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
    kiln::write_file_atomically(  // a failed write leaves the previous file whole
        output, std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dump: error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  }
}

}  // namespace

int kiln::dump_main(int argc, char** argv) {
  return kiln::tools::finish_output("dump", run(argc, argv));
}
