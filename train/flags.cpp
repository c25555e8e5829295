// The table of training flags, and the checks every value goes through.
#include "train/flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace kiln {
namespace {

// The field `member` of the settings group `group` of TrainConfig.
template <class Group, class T>
Flag::Field at(Group TrainConfig::*group, T Group::*member) {
  return std::function<T&(TrainConfig&)>([=](TrainConfig& c) -> T& { return (c.*group).*member; });
}

Flag::Field model_field() {
  return std::function<std::string&(TrainConfig&)>(
      [](TrainConfig& c) -> std::string& { return c.model; });
}

using L = LoopSettings;
using D = DeviceSettings;
using P = ParallelSettings;
using I = ImageSettings;
using M = LmSettings;
using G = GanSettings;
constexpr auto loop = &TrainConfig::loop;
constexpr auto device = &TrainConfig::device;
constexpr auto parallel = &TrainConfig::parallel;
constexpr auto images = &TrainConfig::images;
constexpr auto lm = &TrainConfig::lm;
constexpr auto gan = &TrainConfig::gan;
constexpr unsigned all = kAllTasks;
constexpr double kMaxSteps = 1e15;  // kMaxCheckpointSteps: the most steps a run may count

// Numbers in [min, max]; open_number: min excluded.
Flag number(std::string name, Flag::Field field, unsigned tasks, std::string help, double min,
            double max = 1e300) {
  Flag f{
      .name = std::move(name), .field = std::move(field), .tasks = tasks, .help = std::move(help)};
  f.min = min;
  f.max = max;
  return f;
}
Flag open_number(std::string name, Flag::Field field, unsigned tasks, std::string help, double min,
                 double max = 1e300) {
  Flag f = number(std::move(name), std::move(field), tasks, std::move(help), min, max);
  f.min_open = true;
  return f;
}
// An integer whose value `off` means "not set" (written as null).
Flag with_off(Flag f, std::int64_t off) {
  f.has_off = true;
  f.off = off;
  return f;
}
Flag text(std::string name, Flag::Field field, unsigned tasks, std::string help,
          std::vector<std::string> choices = {}) {
  return {.name = std::move(name),
          .field = std::move(field),
          .tasks = tasks,
          .help = std::move(help),
          .choices = std::move(choices)};
}
Flag boolean(std::string name, Flag::Field field, unsigned tasks, std::string help) {
  return {
      .name = std::move(name), .field = std::move(field), .tasks = tasks, .help = std::move(help)};
}
Flag negated(Flag f) {
  f.negated = true;
  return f;
}
Flag command_line_only(Flag f) {
  f.saved = false;
  return f;
}

std::vector<Flag> loop_flags() {
  return {
      text("model", model_field(), all, "model to train"),
      number("epochs", at(loop, &L::epochs), all, "passes over the training data", 1, 1e9),
      number("batch-size", at(loop, &L::batch_size), all, "examples per step (per rank)", 1,
             1 << 24),
      number("accumulate", at(loop, &L::accumulate), kClassifierTask | kLmTask,
             "micro-batches of --batch-size a step sums before its one update (a step trains on "
             "N x the batch, in the memory of one)",
             1, 1 << 16),
      with_off(number("max-steps", at(loop, &L::max_steps), all,
                      "stop after this many training steps", 1, kMaxSteps),
               -1),
      text("optimizer", at(loop, &L::optimizer), all, "the update rule", {"sgd", "adam", "adamw"}),
      open_number("lr", at(loop, &L::lr), all, "learning rate (GANs: 2e-4 unless given)", 0, 1e12),
      number("momentum", at(loop, &L::momentum), all, "SGD momentum", 0, 1),
      number("weight-decay", at(loop, &L::weight_decay), all, "weight decay", 0, 1e12),
      number("clip-grad-norm", at(loop, &L::clip_grad_norm), all,
             "scale gradients to a global L2 norm of at most this (0: off)", 0, 1e30),
      text("lr-schedule", at(loop, &L::lr_schedule), all,
           "constant, step (x --lr-gamma every --lr-step-size steps) or cosine decay to 0 (GANs: "
           "constant unless given)",
           {"constant", "step", "cosine"}),
      number("warmup-steps", at(loop, &L::warmup_steps), all, "linear learning-rate warm-up steps",
             0, kMaxSteps),
      number("lr-step-size", at(loop, &L::lr_step_size), all, "step schedule: steps between decays",
             1, kMaxSteps),
      open_number("lr-gamma", at(loop, &L::lr_gamma), all, "step schedule: decay factor", 0, 1),
      number("seed", at(loop, &L::seed), all,
             "seed of initialisation, data order and noise (up to 2^64 - 1)", 0),
      text("checkpoint", at(loop, &L::checkpoint), all, "save a checkpoint here after every epoch"),
      with_off(number("save-every", at(loop, &L::save_every), all, "also save every N steps", 1,
                      kMaxSteps),
               0),
      text("resume", at(loop, &L::resume), all, "continue training from this checkpoint"),
      text("metrics", at(loop, &L::metrics), all, "append metrics as JSON lines here"),
      number("metrics-every", at(loop, &L::metrics_every), all,
             "steps per 'step' line of --metrics", 1, kMaxSteps),
      text("trace", at(loop, &L::trace), all,
           "write a Chrome/Perfetto trace (JSON) of the 10th training step here"),
      negated(boolean(
          "no-progress", at(loop, &L::progress), all,
          "no progress output (a redrawn bar on a terminal, else a line per 10 % of an epoch)")),
  };
}

std::vector<Flag> device_flags() {
  return {
      text("device", at(device, &D::name), all, "where the steps run (auto: the GPU if any)",
           {"cpu", "cuda", "auto"}),
      number("threads", at(device, &D::threads), all, "CPU threads (0: all cores)", 0, 4096),
      negated(boolean("no-cuda-graphs", at(device, &D::cuda_graphs), all,
                      "CUDA: launch kernel by kernel instead of replaying a captured graph")),
      text("precision", at(device, &D::precision), all,
           "fp32; tf32 (CUDA: TF32 GEMMs); bf16 or fp16: 16-bit activations and GEMM/conv "
           "inputs, fp32 master weights and optimizer state (fp16 with a dynamic loss scale)",
           {"fp32", "tf32", "bf16", "fp16"}),
      boolean("tf32", at(device, &D::tf32), all, "the same as --precision tf32"),
      number("streams", at(device, &D::streams), all, "CUDA: streams of the schedule", 1, 8),
      boolean("check-numerics", at(device, &D::check_numerics), all,
              "stop at the first op whose output has a NaN or Inf (ops then run unfused)"),
      boolean("deterministic", at(device, &D::deterministic), all,
              "bitwise-reproducible runs (on the GPU this also forbids cuBLAS atomics)"),
  };
}

std::vector<Flag> parallel_flags() {
  return {
      command_line_only(
          with_off(number("gpus", at(parallel, &P::gpus), all,
                          "data parallel: train on N GPUs of this host (NCCL)", 1, 1024),
                   0)),
      command_line_only(with_off(number("ranks", at(parallel, &P::ranks), all,
                                        "data parallel: N processes on this host on --device "
                                        "(CPU: TCP)",
                                        1, 1024),
                                 0)),
      number("rank", at(parallel, &P::rank), all, "data parallel: this process's rank", 0, 1 << 16),
      number("world-size", at(parallel, &P::world_size), all,
             "data parallel: processes in the job (all hosts)", 1, 1 << 16),
      text("init", at(parallel, &P::init), all, "data parallel: HOST:PORT where rank 0 listens"),
      number("init-timeout", at(parallel, &P::init_timeout), all,
             "data parallel: seconds to wait for the other ranks (and a silent rank)", 0.1, 86400),
      number("bucket-kib", at(parallel, &P::bucket_kib), all,
             "data parallel: KiB of gradients per all-reduce", 1, 1 << 22),
      number("check-replicas", at(parallel, &P::check_replicas), all,
             "data parallel: compare every variable across the ranks every K steps (0: off)", 0,
             kMaxSteps),
      boolean("sync-batch-norm", at(parallel, &P::sync_batch_norm), kImageTasks,
              "data parallel: batch norm's statistics over every rank's batch together (the "
              "global batch's), not each rank's own (models with batch norm: resnet, resnet18, "
              "vgg, inception, dcgan)"),
  };
}

std::vector<Flag> task_flags() {
  return {
      text("data", at(images, &I::data), kClassifierTask,
           "the images: fashion-mnist[:DIR], cifar10:DIR, cifar100:DIR, folder:DIR or "
           "synthetic[:CxHxW]"),
      text("data-dir", at(images, &I::data_dir), kImageTasks,
           "directory with the Fashion-MNIST IDX files"),
      boolean("synthetic", at(images, &I::synthetic), kImageTasks,
              "train on random images of the right shape"),
      number("eval-batch", at(images, &I::eval_batch), kClassifierTask,
             "examples per evaluation step", 1, 1 << 24),
      with_off(number("image-size", at(images, &I::image_size), kClassifierTask,
                      "folders: resize every image to N x N", 1, 4096),
               0),
      open_number("test-fraction", at(images, &I::test_fraction), kClassifierTask,
                  "folders without train/ and test/: the share of each class held out", 0, 0.9),
      number("pad", at(images, &I::pad), kClassifierTask,
             "black border of N pixels around every image (Fashion-MNIST to 32x32: 2)", 0, 1024),
      text("mean", at(images, &I::mean), kClassifierTask,
           "per-channel mean of pixels in [0, 1], e.g. 0.49,0.48,0.45 (default: the train set's)"),
      text("std", at(images, &I::std), kClassifierTask,
           "per-channel standard deviation (default: the train set's)"),
      number("crop-padding", at(images, &I::crop_padding), kClassifierTask,
             "augment: random crops of the image padded by N pixels (0: off)", 0, 1024),
      boolean("flip", at(images, &I::flip), kClassifierTask,
              "augment: flip training images horizontally at random"),
      number("label-smoothing", at(images, &I::label_smoothing), kClassifierTask,
             "the training loss's targets (1 - e) one-hot + e / classes (0: off)", 0, 1),
      number("loader-threads", at(images, &I::loader_threads), kClassifierTask,
             "threads filling (augmenting) batches ahead of the step (0: a quarter of the cores, "
             "1 to 8)",
             0, 256),
      number("loader-depth", at(images, &I::loader_depth), kClassifierTask,
             "batches filled ahead of the step (0: 2 per loader thread)", 0, 1024),
      text("text", at(lm, &M::text), kLmTask,
           "the training text, a file or a directory of fortunes-style files"),
      number("seq-len", at(lm, &M::seq_len), kLmTask, "characters per sequence", 1, 1 << 20),
      number("embedding", at(lm, &M::embedding), kLmTask, "embedding width", 1, 1 << 14),
      number("hidden", at(lm, &M::hidden), kLmTask, "LSTM/RNN hidden width", 1, 1 << 14),
      number("layers", at(lm, &M::layers), kLmTask, "LSTM/RNN layers", 1, 64),
      text("cell", at(lm, &M::cell), kLmTask, "recurrent cell: lstm or rnn (tanh)",
           {"lstm", "rnn"}),
      number("sample", at(lm, &M::sample), kLmTask,
             "generate N characters from the --resume checkpoint instead of training", 0, 1 << 30),
      open_number("temperature", at(lm, &M::temperature), kLmTask, "sampling temperature", 0, 1e6),
      text("prime", at(lm, &M::prime), kLmTask, "text the sample starts from"),
      text("samples-dir", at(gan, &G::samples_dir), kGanTask,
           "directory for the PNG grid of samples after each epoch"),
      text("fid-classifier", at(gan, &G::fid_classifier), kGanTask,
           "a lenet checkpoint whose features the FID uses"),
  };
}

std::string range_text(const Flag& f) {
  if (f.max < 1e300) return fmt::format("in {}{}, {:g}]", f.min_open ? "(" : "[", f.min, f.max);
  return f.min_open ? fmt::format("> {}", f.min) : fmt::format("at least {}", f.min);
}

void check_number(const Flag& f, double value, const nlohmann::json& v, const std::string& where) {
  const bool above = f.min_open ? value > f.min : value >= f.min;
  KILN_CHECK(std::isfinite(value) && above && value <= f.max, "{} is {} but must be {}", where,
             json_excerpt(v), range_text(f));
  // A double below the smallest normal one has lost precision (1e-310 is not what it says).
  KILN_CHECK(value == 0 || std::abs(value) >= std::numeric_limits<double>::min(),
             "{} is {}, too close to 0 to be held exactly (nonzero values start at {:g})", where,
             json_excerpt(v), std::numeric_limits<double>::min());
}

template <class T>
void set_integer(const Flag& f, T& field, const nlohmann::json& v, const std::string& where) {
  if (f.has_off && v.is_null()) {
    field = static_cast<T>(f.off);
    return;
  }
  KILN_CHECK(v.is_number_integer(), "{} must be an integer{}, not {}", where,
             f.has_off ? " or null" : "", json_excerpt(v));
  check_number(f,
               v.is_number_unsigned() ? static_cast<double>(v.get<std::uint64_t>())
                                      : static_cast<double>(v.get<std::int64_t>()),
               v, where);
  field = v.get<T>();
}

// A command-line number, parsed exactly: a double that overflows or an integer beyond 64
// bits is refused as out of range (never clamped or wrapped), and a double too close to 0
// to be held exactly is refused as such.
template <class T>
nlohmann::json number_from_text(const std::string& text, const std::string& where) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  nlohmann::json value;
  const bool negative = text.find('-') != std::string::npos;
  if constexpr (std::is_same_v<T, double>)
    value = std::strtod(begin, &end);
  else if (std::is_unsigned_v<T> && !negative)
    value = static_cast<std::uint64_t>(std::strtoull(begin, &end, 10));
  else
    value = static_cast<std::int64_t>(std::strtoll(begin, &end, 10));
  const bool whole = !text.empty() && !std::isspace(static_cast<unsigned char>(text[0])) &&
                     end == begin + text.size();
  KILN_CHECK(whole, "{}: '{}' is not {}", where, excerpt(text),
             std::is_same_v<T, double> ? "a number" : "an integer");
  constexpr bool is_double = std::is_same_v<T, double>;
  const bool range_error = errno == ERANGE;
  const bool underflow = is_double && range_error && std::abs(value.get<double>()) <= 1;
  KILN_CHECK(!underflow,
             "{}: '{}' is too close to 0 to be held exactly (nonzero values start at {:g})", where,
             excerpt(text), std::numeric_limits<double>::min());
  const bool overflow = range_error && !underflow;
  KILN_CHECK(!overflow, "{}: '{}' is out of range ({})", where, excerpt(text),
             std::is_same_v<T, double> ? "beyond the largest double, 1.8e308"
             : std::is_unsigned_v<T>   ? "an integer from 0 to 18446744073709551615"
                                       : "beyond a 64-bit integer");
  return value;
}

}  // namespace

std::string excerpt(std::string_view text, std::size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "...";
}

std::string json_excerpt(const nlohmann::json& value, std::size_t max) {
  return excerpt(value.dump(), max);
}

const std::vector<Flag>& training_flags() {
  static const std::vector<Flag> table = [] {
    std::vector<Flag> all_flags;
    for (auto part : {loop_flags, device_flags, parallel_flags, task_flags})
      for (Flag& f : part()) all_flags.push_back(std::move(f));
    return all_flags;
  }();
  return table;
}

const Flag& training_flag(const std::string& name) {
  for (const Flag& f : training_flags())
    if (f.name == name) return f;
  throw Error(fmt::format("unknown flag '{}'", name));
}

void set_flag(const Flag& f, TrainConfig& c, const nlohmann::json& v, const std::string& where) {
  std::visit(
      [&](const auto& access) {
        auto& field = access(c);
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>) {
          KILN_CHECK(v.is_boolean(), "{} must be true or false, not {}", where, json_excerpt(v));
          field = f.negated ? !v.get<bool>() : v.get<bool>();
        } else if constexpr (std::is_same_v<T, std::string>) {
          KILN_CHECK(v.is_string(), "{} must be a string, not {}", where, json_excerpt(v));
          const auto text = v.get<std::string>();
          KILN_CHECK(f.choices.empty() ||
                         std::find(f.choices.begin(), f.choices.end(), text) != f.choices.end(),
                     "{} is '{}' (one of: {})", where, excerpt(text), fmt::join(f.choices, ", "));
          field = text;
        } else if constexpr (std::is_same_v<T, double>) {
          KILN_CHECK(v.is_number(), "{} must be a number, not {}", where, json_excerpt(v));
          check_number(f, v.get<double>(), v, where);
          field = v.get<double>();
        } else {
          set_integer(f, field, v, where);
        }
      },
      f.field);
}

nlohmann::json get_flag(const Flag& f, const TrainConfig& config) {
  TrainConfig& c = const_cast<TrainConfig&>(config);  // the accessors only read here
  return std::visit(
      [&](const auto& access) -> nlohmann::json {
        const auto& field = access(c);
        using T = std::decay_t<decltype(field)>;
        if constexpr (std::is_same_v<T, bool>) {
          return f.negated ? !field : field;
        } else if constexpr (std::is_integral_v<T>) {
          if (f.has_off && static_cast<std::int64_t>(field) == f.off) return nullptr;
          return field;
        } else {
          return field;
        }
      },
      f.field);
}

nlohmann::json flag_text_value(const Flag& f, const std::string& text, const std::string& where) {
  return std::visit(
      [&](const auto& access) -> nlohmann::json {
        using T = std::decay_t<decltype(access(std::declval<TrainConfig&>()))>;
        if constexpr (std::is_same_v<T, std::string>) {
          return text;
        } else if constexpr (std::is_same_v<T, bool>) {
          return true;
        } else {
          return number_from_text<T>(text, where);
        }
      },
      f.field);
}

void validate_config(const TrainConfig& config) {
  TrainConfig scratch = config;
  for (const Flag& f : training_flags()) set_flag(f, scratch, get_flag(f, config), "--" + f.name);
}

}  // namespace kiln
