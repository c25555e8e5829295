// trainer: trains a model from the command line; evaluates or applies a trained one.
//   trainer --model lenet --epochs 2 --checkpoint c.safetensors
//   trainer eval --checkpoint c.safetensors
//   trainer predict --checkpoint c.safetensors --images t10k-images-idx3-ubyte.gz
// Exit codes: 0 done, 1 a runtime error (bad data, divergence), 2 a bad flag or value.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>

#include <cmath>

#include "backends/device_warm_up.h"
#include "core/log.h"
#include "data/dataset.h"
#include "gpu/cuda_runtime.h"
#include "train/config_file.h"
#include "models/registry.h"
#include "train/train.h"
#include "train/train_gan.h"
#include "train/train_lm.h"
#include "tools/cli.h"
#include "tools/trainer_commands.h"
#include "tools/trainer_parallel.h"

namespace {

// auto: the GPU when one is there, else the CPU.
kiln::Device parse_device(const std::string& name) {
  if (name == "cpu") return kiln::Device::cpu();
  if (name == "cuda") {
    KILN_CHECK(kiln::gpu::cuda_device_count() > 0, "--device cuda: {}",
               kiln::gpu::cuda_unavailable_reason());
    return kiln::Device::cuda();
  }
  if (name == "auto")
    return kiln::gpu::cuda_device_count() > 0 ? kiln::Device::cuda() : kiln::Device::cpu();
  throw kiln::Error(fmt::format("unknown device '{}'", name));
}

// A number check with a readable message: strictly above `low` (or at least `low` when
// `inclusive`).
CLI::Validator number_from(double low, bool inclusive) {
  const std::string description = fmt::format("{} {}", inclusive ? ">=" : ">", low);
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        std::size_t used = 0;
        double value = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(value))
          return fmt::format("'{}' is not a finite number", text);
        if (inclusive ? value < low : value <= low)
          return fmt::format("{} must be {}", text, description);
        return "";
      },
      description);
}

// char-lstm: trains, or with --sample prints text generated from the --resume checkpoint.
int run_language_model(const kiln::TrainConfig& config) {
  if (config.sample_chars > 0) {
    fmt::print("{}\n", kiln::sample_language_model(config));
    return 0;
  }
  kiln::train_language_model(config, [](const kiln::LmEpochResult& r) {
    fmt::print(
        "epoch {}: train {:.3f} bits/char, validation {:.3f} bits/char, {:.0f} chars/s, {:.1f} s "
        "({} steps)\n",
        r.epoch, r.train_bits_per_char, r.validation_bits_per_char, r.chars_per_second, r.seconds,
        r.steps);
    std::fflush(stdout);
  });
  return 0;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const kiln::ModelInfo& m : kiln::model_infos()) names.push_back(m.name);
  return names;
}

// GANs: Adam at 2e-4 (beta1 0.5) with a constant rate, where neither a flag nor the config
// file moved the learning rate or schedule from the classifiers' defaults.
void apply_gan_defaults(const CLI::App& app, kiln::TrainConfig& config) {
  const kiln::TrainConfig defaults;
  if (app.count("--lr") == 0 && config.lr == defaults.lr) config.lr = kiln::kGanLr;
  if (app.count("--lr-schedule") == 0 && config.lr_schedule == defaults.lr_schedule)
    config.lr_schedule = "constant";
}

void run_gan(const kiln::TrainConfig& config) {
  kiln::train_gan(config, [](const kiln::GanEpochResult& r) {
    const std::string fid = std::isnan(r.fid) ? "" : fmt::format(", FID {:.2f}", r.fid);
    fmt::print(
        "epoch {}: D loss {:.4f}, G loss {:.4f}, D accuracy {:.1f}%{}, {:.0f} images/s, {:.1f} s, "
        "samples {}\n",
        r.epoch, r.d_loss, r.g_loss, 100.0 * r.d_accuracy, fid, r.images_per_second, r.seconds,
        r.samples_path);
    std::fflush(stdout);
  });
}

}  // namespace

// The value of --config in argv, read before the flags so that flags override the file.
std::string config_argument(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) return argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) return arg.substr(9);
  }
  return "";
}

int main(int argc, char** argv) {
  kiln::TrainConfig config;
  std::string config_path = config_argument(argc, argv);
  if (!config_path.empty()) {
    try {
      config = kiln::read_train_config(config_path, config);
    } catch (const kiln::Error& e) {
      fmt::print(stderr, "trainer: error: {}\n", e.what());
      return 2;
    }
  }
  std::string device = "auto";
  int threads = 0;
  bool no_progress = false;

  CLI::App app{
      "kiln trainer: trains a model on Fashion-MNIST (or synthetic data) and reports test "
      "accuracy"};
  app.add_option("--config", config_path,
                 "a JSON file of flag names and values (flags given here override it)");
  app.add_option("--model", config.model, "model to train")
      ->check(CLI::IsMember(model_names()))
      ->capture_default_str();
  app.add_option("--epochs", config.epochs, "passes over the training set")
      ->check(number_from(0, false))
      ->capture_default_str();
  app.add_option("--batch-size", config.batch_size, "examples per step")
      ->check(number_from(0, false))
      ->capture_default_str();
  app.add_option("--lr", config.lr, "learning rate (GANs: 2e-4 unless given)")
      ->check(number_from(0, false))
      ->capture_default_str();
  app.add_option("--optimizer", config.optimizer, "sgd, adam or adamw")
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr-schedule", config.lr_schedule,
                 "constant, step (x --lr-gamma every --lr-step-size steps) or cosine decay to 0 "
                 "(GANs: constant unless given)")
      ->check(CLI::IsMember({"constant", "step", "cosine"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", config.warmup_steps,
                 "linear learning-rate warm-up over this many steps")
      ->check(number_from(0, true));
  app.add_option("--lr-step-size", config.lr_step_size, "step schedule: steps between decays")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--lr-gamma", config.lr_gamma, "step schedule: decay factor")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--clip-grad-norm", config.clip_grad_norm,
                 "scale gradients to a global L2 norm of at most this (0: off)")
      ->check(number_from(0, true));
  app.add_option("--metrics", config.metrics_path,
                 "append metrics as JSON lines (step, epoch, loss, accuracy, throughput, lr) here");
  app.add_option("--metrics-every", config.metrics_every, "steps per 'step' line of --metrics")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--momentum", config.momentum, "SGD momentum")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--weight-decay", config.weight_decay, "weight decay")
      ->check(number_from(0, true))
      ->capture_default_str();
  app.add_option("--seed", config.seed, "seed of initialisation and shuffling")
      ->capture_default_str();
  app.add_option("--data-dir", config.data_dir, "directory with the IDX files")
      ->default_str(kiln::kFashionMnistDir);
  app.add_flag("--synthetic", config.synthetic, "train on random data of the right shape");
  app.add_option("--max-steps", config.max_steps, "stop after this many training steps")
      ->check(number_from(1, true));
  app.add_option("--eval-batch", config.eval_batch, "examples per evaluation step")
      ->check(number_from(0, false))
      ->capture_default_str();
  app.add_option("--device", device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--threads", threads, "CPU threads (0: all cores)")->check(number_from(0, true));
  app.add_flag("--no-progress", no_progress, "no progress bar");
  bool no_graphs = false;
  app.add_flag("--no-cuda-graphs", no_graphs,
               "CUDA: launch kernel by kernel instead of replaying a captured graph (debugging)");
  app.add_flag("--check-numerics", config.check_numerics,
               "stop at the first op whose output has a NaN or Inf (also KILN_CHECK_NUMERICS=1; "
               "ops then run unfused)");
  app.add_flag(
      "--deterministic", config.deterministic,
      "bitwise-reproducible runs (the CPU always is; on the GPU this also forbids cuBLAS atomics)");
  app.add_option("--checkpoint", config.checkpoint_path,
                 "save a checkpoint (safetensors) here after every epoch");
  app.add_option("--save-every", config.save_every, "also save every N steps")
      ->check(number_from(1, true));
  app.add_option("--resume", config.resume_path, "continue training from this checkpoint")
      ->check(CLI::ExistingFile);
  app.add_option("--trace", config.trace_path,
                 "write a Chrome/Perfetto trace (JSON) of the 10th training step here");
  app.add_option("--streams", config.cuda_streams,
                 "CUDA: streams of the schedule (1: one stream, 2: weight gradients beside)")
      ->check(CLI::Range(1, 2))
      ->capture_default_str();
  app.add_option("--text", config.text_path,
                 "char-lstm: the training text, a file or a directory of fortunes-style files "
                 "(default: the fortunes corpus)");
  app.add_option("--seq-len", config.seq_len, "char-lstm: characters per sequence")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--embedding", config.embedding, "char-lstm: embedding width")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--hidden", config.hidden, "LSTM/RNN hidden width")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--layers", config.layers, "LSTM/RNN layers")
      ->check(number_from(1, true))
      ->capture_default_str();
  app.add_option("--cell", config.cell, "recurrent cell: lstm or rnn (tanh)")
      ->check(CLI::IsMember({"lstm", "rnn"}))
      ->capture_default_str();
  app.add_flag("--bidirectional", config.bidirectional, "row-lstm: a bidirectional LSTM");
  app.add_option("--sample", config.sample_chars,
                 "char-lstm: generate N characters from the --resume checkpoint")
      ->check(number_from(1, true));
  app.add_option("--temperature", config.temperature, "char-lstm sampling temperature")
      ->check(number_from(0, false))
      ->capture_default_str();
  app.add_option("--prime", config.prime, "char-lstm: text the sample starts from");
  app.add_option("--samples-dir", config.samples_dir,
                 "GAN: directory for the PNG grid of samples after each epoch")
      ->capture_default_str();
  app.add_option("--fid-classifier", config.fid_classifier,
                 "GAN: a lenet checkpoint whose features the FID uses")
      ->check(CLI::ExistingFile);
  app.add_flag(
      "--tf32", config.tf32,
      "CUDA: allow TF32 tensor-core math in GEMMs (faster, about 3 fewer significant digits)");

  kiln::tools::ParallelArgs parallel;
  kiln::tools::add_parallel_options(app, config, parallel);

  kiln::tools::InferenceArgs inference;
  CLI::App* eval = kiln::tools::add_eval_command(app, inference);
  CLI::App* predict = kiln::tools::add_predict_command(app, inference);
  app.require_subcommand(0, 1);

  if (const auto code = kiln::tools::parse_command_line(app, argc, argv)) return *code;

  try {
    if (eval->parsed() || predict->parsed()) {
      const kiln::Device inference_device = parse_device(inference.device);
      if (inference.threads > 0) omp_set_num_threads(inference.threads);
      if (eval->parsed()) kiln::tools::run_eval(inference, inference_device);
      if (predict->parsed()) kiln::tools::run_predict(inference, inference_device);
      return 0;
    }
    if (const auto code = kiln::tools::launch_ranks_if_asked(parallel, config, argc, argv))
      return *code;
    config.device =
        parse_device(parallel.gpus > 0 ? "cuda" : device);  // --gpus 1: this process, on the GPU
    const kiln::DeviceWarmUp warm_up(
        config.device);  // the GPU's context and cuBLAS, while data loads
    config.progress = !no_progress;
    config.cuda_graphs = !no_graphs;
    if (threads > 0) omp_set_num_threads(threads);
    const kiln::ModelTask task = kiln::model_info(config.model).task;
    KILN_CHECK(config.sample_chars == 0 || task == kiln::ModelTask::language_model,
               "--sample: model {} is not a language model", config.model);
    if (task == kiln::ModelTask::gan) apply_gan_defaults(app, config);
    if (config.sample_chars == 0 && config.rank == 0) {
      const std::string ranks =
          config.world_size > 1 ? fmt::format(" x {} ranks", config.world_size) : "";
      fmt::print("kiln trainer: model {} on {}, {} epochs, batch {}{}, {} lr {}, {} threads\n",
                 config.model, config.device.str(), config.epochs, config.batch_size, ranks,
                 config.optimizer, config.lr, omp_get_max_threads());
      std::fflush(stdout);
    }
    if (task == kiln::ModelTask::language_model) return run_language_model(config);
    if (task == kiln::ModelTask::gan) {
      run_gan(config);
      return 0;
    }
    kiln::train_classifier(config, [&config](const kiln::EpochResult& r) {
      if (config.rank != 0) return;  // rank 0 evaluates and reports
      fmt::print(
          "epoch {}: train loss {:.4f}, test loss {:.4f}, test accuracy {:.2f}%, {:.0f} images/s, "
          "{:.1f} s\n",
          r.epoch, r.train_loss, r.test_loss, 100.0 * r.test_accuracy, r.images_per_second,
          r.seconds);
      std::fflush(stdout);
    });
    return 0;
  } catch (const kiln::Error& e) {
    fmt::print(stderr, "trainer: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "trainer: internal error: {}\n", e.what());
    return 1;
  }
}
