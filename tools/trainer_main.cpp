// The trainer's command line (tools/tool_main.h): trains a model, evaluates or applies a
// trained one.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <filesystem>

#include "backends/device_warm_up.h"
#include "core/log.h"
#include "train/config_file.h"
#include "train/flags.h"
#include "train/lm_task.h"
#include "train/tasks.h"
#include "tools/cli.h"
#include "tools/openmp_defaults.h"
#include "tools/trainer_commands.h"
#include "tools/trainer_flags.h"
#include "tools/trainer_parallel.h"
#include "tools/output_check.h"
#include "tools/tool_main.h"

namespace {

// The value of --config in argv, read before the flags so that flags override the file.
std::string config_argument(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) return argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) return arg.substr(9);
  }
  return "";
}

// The library's defaults, but on the GPU when there is one.
kiln::TrainConfig trainer_defaults() {
  kiln::TrainConfig config;
  config.device.name = "auto";
  return config;
}

void print_start(const kiln::TrainConfig& c) {
  if (c.lm.sample > 0 || c.parallel.rank != 0) return;
  const int world = c.parallel.world_size;
  const std::string ranks = world > 1 ? fmt::format(" x {} ranks", world) : "";
  fmt::print("kiln trainer: model {} on {}, {} epochs, batch {}{}, {} lr {}, {} threads\n", c.model,
             kiln::resolve_device(c.device.name).str(), c.loop.epochs, c.loop.batch_size, ranks,
             c.loop.optimizer, c.loop.lr, omp_get_max_threads());
  std::fflush(stdout);
}

// Trains (or, for --sample, generates text) in this process.
int train_here(const kiln::TrainConfig& config) {
  const kiln::TaskEntry& task = kiln::task_entry(config.model);
  if (config.lm.sample > 0) {
    fmt::print("{}\n", kiln::sample_language_model(config));
    return 0;
  }
  const kiln::DeviceWarmUp warm_up(kiln::resolve_device(config.device.name));  // while data loads
  print_start(config);
  kiln::train(config, [&](const kiln::EpochReport& r) {
    if (config.parallel.rank != 0) return;  // rank 0 evaluates and reports
    fmt::print("{}\n", task.summary(config, r));
    std::fflush(stdout);
  });
  return 0;
}

// eval and predict take their own flags: a training flag before them would be ignored.
void refuse_training_flags(const std::set<std::string>& given, bool config, const char* command) {
  KILN_CHECK(!config, "--config does not apply to trainer {} (its flags: trainer {} --help)",
             command, command);
  KILN_CHECK(given.empty(),
             "--{} is a training flag: it does not apply to trainer {} (its flags: trainer {} "
             "--help)",
             given.empty() ? "" : *given.begin(), command, command);
}

int run_inference(const kiln::tools::InferenceArgs& inference, bool eval) {
  const kiln::Device device = kiln::resolve_device(inference.device);
  if (inference.threads > 0) omp_set_num_threads(inference.threads);
  if (eval) kiln::tools::run_eval(inference, device);
  if (!eval) kiln::tools::run_predict(inference, device);
  return 0;
}

}  // namespace

namespace {

int run(int argc, char** argv) {
  kiln::TrainConfig config = trainer_defaults();
  std::set<std::string> given;  // flags set by --config or the command line
  std::string config_path = config_argument(argc, argv);
  CLI::App app{
      "kiln trainer: trains a model on Fashion-MNIST, a text or synthetic data (flags marked "
      "[models] apply to those models only)"};
  app.add_option("--config", config_path,
                 "a JSON file of flag names and values (flags given here override it)");
  kiln::tools::FlagValues values;
  kiln::tools::add_training_flags(app, config, values);
  kiln::tools::InferenceArgs inference;
  CLI::App* eval = kiln::tools::add_eval_command(app, inference);
  CLI::App* predict = kiln::tools::add_predict_command(app, inference);
  app.require_subcommand(0, 1);
  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;

  try {
    const char* command = eval->parsed() ? "eval" : predict->parsed() ? "predict" : nullptr;
    if (command) refuse_training_flags({}, !config_path.empty(), command);
    if (!config_path.empty()) config = kiln::read_train_config(config_path, config, &given);
    kiln::tools::apply_training_flags(app, values, config, given);
    if (command) refuse_training_flags(given, false, command);
    if (!command) kiln::check_flags_apply(given, config.model);
  } catch (const kiln::Error& e) {  // a bad flag or value
    fmt::print(stderr, "trainer: error: {}\n", kiln::tools::one_line(e.what()));
    return 2;
  }
  try {
    if (eval->parsed() || predict->parsed()) return run_inference(inference, eval->parsed());
    const kiln::TaskEntry& task = kiln::task_entry(config.model);
    if (task.apply_defaults) task.apply_defaults(config, given);
    if (const auto code = kiln::tools::launch_ranks_if_asked(config, argc, argv)) return *code;
    if (config.parallel.gpus > 0) config.device.name = "cuda";  // --gpus 1: this process
    if (config.device.threads > 0) omp_set_num_threads(config.device.threads);
    return train_here(config);
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "trainer: error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  } catch (
      const std::filesystem::filesystem_error& e) {  // the user's paths, not a broken invariant
    fmt::print(stderr, "trainer: error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "trainer: internal error: {}\n", kiln::tools::one_line(e.what()));
    return 1;
  }
}

}  // namespace

int kiln::trainer_main(int argc, char** argv) {
  kiln::tools::use_openmp_defaults(argv);
  return kiln::tools::finish_output("trainer", run(argc, argv));
}
