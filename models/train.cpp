// train_classifier: data, model, optimizer, compiled train and eval steps, the loop.
#include "models/train.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <cmath>

#include "backends/compile.h"
#include "graph/nn/functional.h"
#include "core/log.h"
#include "models/checkpoint.h"
#include "models/dataset.h"
#include "models/lr_schedule.h"
#include "models/progress.h"
#include "models/registry.h"
#include "models/step_graph.h"

namespace kiln {
namespace {

// Counts rows of logits [N, C] whose largest entry is at the label.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::int64_t n = logits.shape()[0], classes = logits.shape()[1];
  const float* l = logits.data<float>();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* row = l + i * classes;
    const std::int64_t best = std::max_element(row, row + classes) - row;
    correct += best == labels.data<std::int64_t>()[i];
  }
  return correct;
}

// Evaluates in batches of `batch` (and one program for a smaller tail, if any).
class Evaluator {
 public:
  Evaluator(nn::Layer& model, const ModelInfo& info, std::int64_t batch, const Dataset& data, const CompileOptions& options)
      : model_(model), info_(info), data_(data), options_(options), batch_(std::min(batch, data.size())) {}

  double accuracy() {
    std::int64_t correct = 0;
    for (std::int64_t begin = 0; begin < data_.size(); begin += batch_) {
      const std::int64_t count = std::min(batch_, data_.size() - begin);
      Program& p = program_for(count);
      Outputs out = p.run({{"x", data_.images.narrow_rows(begin, count)}});
      correct += count_correct(out.at("logits"), data_.labels.narrow_rows(begin, count));
    }
    return static_cast<double>(correct) / static_cast<double>(data_.size());
  }

 private:
  Program& program_for(std::int64_t count) {
    auto& slot = count == batch_ ? full_ : tail_;
    if (!slot) {
      Graph g;
      const bool was_training = model_.training();
      model_.set_training(false);  // batch norm on running statistics, no dropout
      g.output("logits", model_(g.input("x", batch_shape(count, info_.input_shape))));
      model_.set_training(was_training);
      slot = compile(g, options_);
    }
    return *slot;
  }

  nn::Layer& model_;
  const ModelInfo& info_;
  const Dataset& data_;
  CompileOptions options_;
  std::int64_t batch_;
  std::unique_ptr<Program> full_, tail_;
};

}  // namespace

std::vector<EpochResult> train_classifier(const TrainConfig& c, const std::function<void(const EpochResult&)>& on_epoch,
                                          const std::function<void(const std::vector<VariablePtr>&)>& on_finish) {
  KILN_CHECK(c.epochs >= 1, "epochs must be at least 1 (got {})", c.epochs);
  KILN_CHECK(c.batch_size >= 1, "batch size must be at least 1 (got {})", c.batch_size);
  KILN_CHECK(std::isfinite(c.lr) && c.lr > 0, "learning rate must be positive (got {})", c.lr);
  const ModelInfo& info = model_info(c.model);
  if (!c.checkpoint_path.empty()) {  // fail now, not after an epoch of work
    const std::filesystem::path parent = std::filesystem::absolute(c.checkpoint_path).parent_path();
    KILN_CHECK(std::filesystem::is_directory(parent), "--checkpoint {}: the directory {} does not exist", c.checkpoint_path, parent.string());
    KILN_CHECK(access(parent.c_str(), W_OK) == 0, "--checkpoint {}: the directory {} is not writable", c.checkpoint_path, parent.string());
  }
  const std::string dir = c.data_dir.empty() ? kFashionMnistDir : c.data_dir;
  const Dataset train = c.synthetic ? synthetic_images(4096, info.input_shape, info.classes, c.seed) : load_fashion_mnist(dir, Split::train);
  const Dataset test = c.synthetic ? synthetic_images(1000, info.input_shape, info.classes, c.seed + 1) : load_fashion_mnist(dir, Split::test);

  const OptimizerConfig opt{.name = c.optimizer, .lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay};
  ModelGraph train_graph = build_model_graph(c.model, Stage::train, c.batch_size, opt, c.seed);
  nn::Layer& model = *train_graph.model;
  Optimizer& optimizer = *train_graph.optimizer;
  const CompileOptions options{.device = c.device, .cuda_graphs = c.cuda_graphs, .tf32 = c.tf32, .cuda_streams = c.cuda_streams,
                                .check_numerics = c.check_numerics,
                                .deterministic = c.deterministic};
  std::unique_ptr<Program> step = compile(*train_graph.graph, options);
  Evaluator evaluator(model, info, c.eval_batch, test, options);

  Batcher batcher(train, c.batch_size, true, c.seed);
  // Two host batches in turn: while step s runs on the batch in one, the next batch (in the
  // other) is announced for prefetch, so a GPU copies it during the step.
  Tensor images[2] = {Tensor::empty(batch_shape(c.batch_size, info.input_shape), DType::f32),
                      Tensor::empty(batch_shape(c.batch_size, info.input_shape), DType::f32)};
  Tensor labels[2] = {Tensor::empty({c.batch_size}, DType::i64), Tensor::empty({c.batch_size}, DType::i64)};
  std::vector<EpochResult> results;
  TrainingPosition start;
  if (!c.resume_path.empty()) {
    start = load_checkpoint(c.resume_path, model.parameters(), optimizer.state(), nullptr, model.buffers());
    log().info("resumed from {} at epoch {} batch {} (step {})", c.resume_path, start.epoch, start.batch, start.step);
  }
  const std::map<std::string, std::string> settings = {
      {"model", c.model}, {"batch_size", std::to_string(c.batch_size)}, {"optimizer", c.optimizer},
      {"lr", fmt::format("{}", c.lr)}, {"lr_schedule", c.lr_schedule}, {"seed", std::to_string(c.seed)}, {"epochs", std::to_string(c.epochs)}};
  auto save = [&](const TrainingPosition& at) {
    if (!c.checkpoint_path.empty()) save_checkpoint(c.checkpoint_path, model.parameters(), optimizer.state(), at, settings, model.buffers());
  };
  std::int64_t total_steps = start.step;
  const std::int64_t planned_steps =
      c.max_steps >= 0 ? std::min(c.max_steps, c.epochs * batcher.batches_per_epoch()) : c.epochs * batcher.batches_per_epoch();
  const LrSchedule schedule{.kind = c.lr_schedule, .base_lr = c.lr, .warmup_steps = c.warmup_steps, .step_size = c.lr_step_size, .gamma = c.lr_gamma};
  schedule.validate();
  for (std::int64_t epoch = start.epoch; epoch <= c.epochs; ++epoch) {
    batcher.start_epoch(epoch);
    const std::int64_t first = epoch == start.epoch ? start.batch : 0;  // a resumed epoch starts mid-way
    std::int64_t steps = batcher.batches_per_epoch();
    if (c.max_steps >= 0) steps = std::min(steps, first + c.max_steps - total_steps);
    if (steps <= first) break;
    const std::int64_t ran = steps - first;
    // The position after batch `b` of this epoch (the next epoch's start after its last).
    auto after = [&](std::int64_t b, std::int64_t done_steps) {
      return b == batcher.batches_per_epoch() ? TrainingPosition{done_steps, epoch + 1, 0} : TrainingPosition{done_steps, epoch, b};
    };
    Progress progress(fmt::format("epoch {}/{}", epoch, c.epochs), ran, c.progress && stderr_is_terminal());
    EpochResult r{.epoch = epoch, .steps = ran};
    double loss_sum = 0;
    const auto clock_start = std::chrono::steady_clock::now();
    for (std::int64_t s = first; s < steps; ++s) {
      const std::int64_t done = total_steps + (s - first);  // steps before this one
      optimizer.set_lr(schedule.at(done, planned_steps));
      if (!c.trace_path.empty() && done == std::min<std::int64_t>(9, planned_steps - 1)) step->trace_next_run(c.trace_path);
      const int slot = static_cast<int>(s % 2);
      if (s == first) batcher.fill(s, images[slot], labels[slot]);  // later batches were filled a step ahead
      if (s + 1 < steps) {
        batcher.fill(s + 1, images[1 - slot], labels[1 - slot]);
        step->prefetch({{"x", images[1 - slot]}, {"y", labels[1 - slot]}});
      }
      double loss = 0;
      try {
        loss = step->run({{"x", images[slot]}, {"y", labels[slot]}}).at("loss").item();
      } catch (const Error& e) {
        throw Error(fmt::format("epoch {} step {}: {}", epoch, s + 1, e.what()));
      }
      KILN_CHECK(std::isfinite(loss), "training diverged: loss is {} at epoch {} step {} (lower the learning rate)", loss,
                 epoch, s + 1);
      loss_sum += loss;
      const std::int64_t in_epoch = s + 1 - first;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
      if (c.progress) progress.update(in_epoch, loss_sum / static_cast<double>(in_epoch), static_cast<double>(in_epoch * c.batch_size) / elapsed);
      if (c.save_every > 0 && (done + 1) % c.save_every == 0) save(after(s + 1, done + 1));
    }
    if (c.progress) progress.finish();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
    r.images_per_second = static_cast<double>(ran * c.batch_size) / r.seconds;
    r.train_loss = loss_sum / static_cast<double>(ran);
    total_steps += ran;
    save(after(steps, total_steps));
    r.test_accuracy = evaluator.accuracy();
    results.push_back(r);
    if (on_epoch) on_epoch(r);
  }
  if (on_finish) on_finish(model.parameters());
  return results;
}

}  // namespace kiln
