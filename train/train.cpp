// train_classifier: data, model, optimizer, compiled train and eval steps, the loop.
#include "train/train.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "backends/compile.h"
#include "core/log.h"
#include "distributed/data_parallel.h"
#include "train/checkpoint.h"
#include "data/dataset.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "models/registry.h"
#include "train/saved_classifier.h"
#include "train/step_graph.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_config(const TrainConfig& c) {
  KILN_CHECK(c.epochs >= 1, "epochs must be at least 1 (got {})", c.epochs);
  KILN_CHECK(c.batch_size >= 1, "batch size must be at least 1 (got {})", c.batch_size);
  KILN_CHECK(std::isfinite(c.lr) && c.lr > 0, "learning rate must be positive (got {})", c.lr);
  lr_schedule_of(c).validate();
  KILN_CHECK(std::isfinite(c.clip_grad_norm) && c.clip_grad_norm >= 0,
             "--clip-grad-norm must be >= 0 (got {})", c.clip_grad_norm);
  KILN_CHECK(c.world_size >= 1 && c.rank >= 0 && c.rank < c.world_size,
             "--rank {} is not a rank of --world-size {}", c.rank, c.world_size);
  KILN_CHECK(c.bucket_kib >= 1, "--bucket-kib must be at least 1 (got {})", c.bucket_kib);
  KILN_CHECK(c.check_replicas >= 0, "--check-replicas must be >= 0 (got {})", c.check_replicas);
  if (c.checkpoint_path.empty() || c.rank != 0) return;
  check_checkpoint_directory(c.checkpoint_path);  // fail now, not after an epoch of work
}

// The "step" lines of --metrics: every `every` steps and after the run's last step, with
// the mean loss and the throughput over the steps since the previous line.
class StepLines {
 public:
  StepLines(MetricsWriter& writer, std::int64_t batch_size, std::int64_t every)
      : writer_(writer), batch_size_(batch_size), every_(every) {}
  // Evaluation between epochs does not count as training time.
  void restart_clock() {
    since_ = Clock::now();
    images_ = 0;
  }
  // After step `step` (1-based, counted over the whole run) of epoch `epoch`.
  void record(std::int64_t step, std::int64_t epoch, double loss, double lr, bool last) {
    loss_sum_ += loss;
    ++losses_;
    images_ += batch_size_;
    if (!writer_.enabled() || (step % every_ != 0 && !last)) return;
    writer_.write("step",
                  {{"step", step},
                   {"epoch", epoch},
                   {"loss", loss_sum_ / static_cast<double>(losses_)},
                   {"lr", lr},
                   {"images_per_second", static_cast<double>(images_) / seconds_since(since_)}});
    loss_sum_ = 0;
    losses_ = 0;
    restart_clock();
  }

 private:
  MetricsWriter& writer_;
  std::int64_t batch_size_, every_;
  double loss_sum_ = 0;
  std::int64_t losses_ = 0, images_ = 0;
  Clock::time_point since_ = Clock::now();
};

// One training run: everything the epochs share.
class ClassifierTraining {
 public:
  // `parallel`: this rank's data-parallel job, or null for one process.
  ClassifierTraining(const TrainConfig& c, dist::DataParallel* parallel)
      : c_(c),
        parallel_(parallel),
        leader_(c.rank == 0),
        info_(model_info(c.model)),
        train_(classifier_data(c, info_, Split::train)),
        test_(classifier_data(c, info_, Split::test)),
        batcher_(train_, c.batch_size, true, c.seed, c.rank, c.world_size),
        graph_(
            build_model_graph(c.model, Stage::train, c.batch_size,
                              {.name = c.optimizer,
                               .lr = c.lr,
                               .momentum = c.momentum,
                               .weight_decay = c.weight_decay},
                              c.seed,
                              {.clip_grad_norm = c.clip_grad_norm,
                               .data_parallel_group = parallel ? parallel->collective_group() : -1,
                               .bucket_bytes = static_cast<std::size_t>(c.bucket_kib) * 1024})),
        options_{.device = c.device,
                 .cuda_graphs = c.cuda_graphs,
                 .tf32 = c.tf32,
                 .cuda_streams = c.cuda_streams,
                 .check_numerics = c.check_numerics,
                 .deterministic = c.deterministic},
        step_(compile(*graph_.graph, options_)),
        evaluator_(*graph_.model, info_.input_shape, c.eval_batch, options_),
        schedule_(lr_schedule_of(c)),
        metrics_(c.metrics_path.empty() || !leader_
                     ? std::make_unique<MetricsWriter>()
                     : std::make_unique<MetricsWriter>(c.metrics_path)),
        step_lines_(*metrics_, c.batch_size * c.world_size, c.metrics_every) {
    for (Tensor* slot : {&images_[0], &images_[1]})
      *slot = Tensor::empty(batch_shape(c.batch_size, info_.input_shape), DType::f32);
    for (Tensor* slot : {&labels_[0], &labels_[1]})
      *slot = Tensor::empty({c.batch_size}, DType::i64);
    const std::int64_t all = c.epochs * batcher_.batches_per_epoch();
    planned_steps_ = c.max_steps >= 0 ? std::min(c.max_steps, all) : all;
  }

  std::vector<EpochResult> run(const std::function<void(const EpochResult&)>& on_epoch);
  nn::Layer& model() { return *graph_.model; }

 private:
  void resume();
  void save(const TrainingPosition& at);
  double train_step(std::int64_t epoch, std::int64_t s, std::int64_t steps, std::int64_t first);
  EpochResult run_epoch(std::int64_t epoch, std::int64_t first, std::int64_t steps);
  void check_replicas(std::int64_t step);

  const TrainConfig& c_;
  dist::DataParallel* parallel_;
  bool leader_;  // rank 0: saves, evaluates, reports
  const ModelInfo& info_;
  Dataset train_, test_;
  Batcher batcher_;
  ModelGraph graph_;
  CompileOptions options_;
  std::unique_ptr<Program> step_;
  Evaluator evaluator_;
  LrSchedule schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  StepLines step_lines_;
  // Two host batches in turn: while step s runs on the batch in one, the next batch (in the
  // other) is announced for prefetch, so a GPU copies it during the step.
  Tensor images_[2], labels_[2];
  TrainingPosition start_;
  std::int64_t total_steps_ = 0;    // steps done, over the whole run
  std::int64_t planned_steps_ = 0;  // the schedule's horizon
  double lr_ = 0;                   // of the last step run
};

void ClassifierTraining::resume() {
  if (c_.resume_path.empty()) return;
  const Checkpoint checkpoint(c_.resume_path);
  check_resumable(c_, checkpoint);
  checkpoint.restore(graph_.model->parameters(), graph_.optimizer->state(),
                     graph_.model->buffers());
  start_ = checkpoint.position();
  log().info("resumed from {} at epoch {} batch {} (step {})", c_.resume_path, start_.epoch,
             start_.batch, start_.step);
}

void ClassifierTraining::save(const TrainingPosition& at) {
  if (c_.checkpoint_path.empty() || !leader_) return;  // the replicas are identical: rank 0 writes
  save_checkpoint(c_.checkpoint_path, graph_.model->parameters(), graph_.optimizer->state(), at,
                  training_metadata(c_), graph_.model->buffers());
}

// Data parallelism: every variable (parameters, optimizer state, buffers) equal on all ranks.
void ClassifierTraining::check_replicas(std::int64_t step) {
  if (parallel_ == nullptr) return;
  std::vector<VariablePtr> vars = graph_.model->parameters();
  for (const std::vector<VariablePtr>& more : {graph_.optimizer->state(), graph_.model->buffers()})
    vars.insert(vars.end(), more.begin(), more.end());
  parallel_->check_replicas(vars, step);
}

// Runs batch `s` of the epoch (whose batches [first, steps) this run trains) and returns its loss.
double ClassifierTraining::train_step(std::int64_t epoch, std::int64_t s, std::int64_t steps,
                                      std::int64_t first) {
  const std::int64_t done = total_steps_ + (s - first);  // steps before this one
  lr_ = schedule_.at(done, planned_steps_);
  graph_.optimizer->set_lr(lr_);
  if (!c_.trace_path.empty() && leader_ && done == std::min<std::int64_t>(9, planned_steps_ - 1))
    step_->trace_next_run(c_.trace_path);
  const int slot = static_cast<int>(s % 2);
  if (s == first)
    batcher_.fill(s, images_[slot], labels_[slot]);  // later batches were filled a step ahead
  if (s + 1 < steps) {
    batcher_.fill(s + 1, images_[1 - slot], labels_[1 - slot]);
    step_->prefetch({{"x", images_[1 - slot]}, {"y", labels_[1 - slot]}});
  }
  double loss = 0;
  try {
    loss = step_->run({{"x", images_[slot]}, {"y", labels_[slot]}}).at("loss").item();
  } catch (const Error& e) {
    throw Error(fmt::format("epoch {} step {}: {}", epoch, s + 1, e.what()));
  }
  KILN_CHECK(std::isfinite(loss),
             "training diverged: loss is {} at epoch {} step {} (lower the learning rate)", loss,
             epoch, s + 1);
  step_lines_.record(done + 1, epoch, loss, lr_, done + 1 == planned_steps_);
  if (c_.check_replicas > 0 && (done + 1) % c_.check_replicas == 0) check_replicas(done + 1);
  return loss;
}

// Trains batches [first, steps) of `epoch`, saves, evaluates.
EpochResult ClassifierTraining::run_epoch(std::int64_t epoch, std::int64_t first,
                                          std::int64_t steps) {
  const std::int64_t ran = steps - first;
  // The position after batch `b` of this epoch (the next epoch's start after its last).
  auto after = [&](std::int64_t b, std::int64_t done_steps) {
    return b == batcher_.batches_per_epoch() ? TrainingPosition{done_steps, epoch + 1, 0}
                                             : TrainingPosition{done_steps, epoch, b};
  };
  const bool show_progress = c_.progress && leader_;
  const std::int64_t global_batch = c_.batch_size * c_.world_size;
  Progress progress(fmt::format("epoch {}/{}", epoch, c_.epochs), ran,
                    show_progress && stderr_is_terminal());
  EpochResult r{.epoch = epoch, .steps = ran};
  double loss_sum = 0;
  const auto clock_start = Clock::now();
  step_lines_.restart_clock();
  for (std::int64_t s = first; s < steps; ++s) {
    loss_sum += train_step(epoch, s, steps, first);
    const std::int64_t in_epoch = s + 1 - first, done = total_steps_ + in_epoch;
    if (show_progress)
      progress.update(in_epoch, loss_sum / static_cast<double>(in_epoch),
                      static_cast<double>(in_epoch * global_batch) / seconds_since(clock_start));
    if (c_.save_every > 0 && done % c_.save_every == 0) save(after(s + 1, done));
  }
  if (show_progress) progress.finish();
  r.seconds = seconds_since(clock_start);
  r.images_per_second = static_cast<double>(ran * global_batch) / r.seconds;
  r.train_loss = loss_sum / static_cast<double>(ran);
  total_steps_ += ran;
  save(after(steps, total_steps_));
  r.lr = lr_;
  if (!leader_) {  // rank 0 evaluates the (identical) model
    r.test_accuracy = r.test_loss = std::nan("");
    return r;
  }
  const EvalResult eval = evaluator_.evaluate(test_);
  r.test_accuracy = eval.accuracy;
  r.test_loss = eval.loss;
  r.lr = lr_;
  metrics_->write("epoch", {{"epoch", epoch},
                            {"step", total_steps_},
                            {"train_loss", r.train_loss},
                            {"test_accuracy", r.test_accuracy},
                            {"test_loss", r.test_loss},
                            {"seconds", r.seconds},
                            {"images_per_second", r.images_per_second},
                            {"lr", r.lr}});
  return r;
}

std::vector<EpochResult> ClassifierTraining::run(
    const std::function<void(const EpochResult&)>& on_epoch) {
  resume();
  total_steps_ = start_.step;
  check_replicas(total_steps_);  // the same initialisation (or checkpoint) on every rank
  std::vector<EpochResult> results;
  for (std::int64_t epoch = start_.epoch; epoch <= c_.epochs; ++epoch) {
    batcher_.start_epoch(epoch);
    const std::int64_t first =
        epoch == start_.epoch ? start_.batch : 0;  // a resumed epoch starts mid-way
    std::int64_t steps = batcher_.batches_per_epoch();
    if (c_.max_steps >= 0) steps = std::min(steps, first + c_.max_steps - total_steps_);
    if (steps <= first) break;
    results.push_back(run_epoch(epoch, first, steps));
    if (on_epoch) on_epoch(results.back());
  }
  return results;
}

}  // namespace

Dataset classifier_data(const TrainConfig& c, const ModelInfo& info, Split split) {
  if (c.synthetic)
    return split == Split::train
               ? synthetic_images(4096, info.input_shape, info.classes, c.seed)
               : synthetic_images(1000, info.input_shape, info.classes, c.seed + 1);
  return load_fashion_mnist(c.data_dir.empty() ? kFashionMnistDir : c.data_dir, split);
}

std::unique_ptr<dist::DataParallel> join_data_parallel(const TrainConfig& c) {
  if (c.world_size <= 1) return nullptr;
  dist::ProcessGroupOptions options{
      .rank = c.rank,
      .world_size = c.world_size,
      .address = c.init,
      .connect_timeout = std::chrono::milliseconds(c.init_timeout_ms)};
  options.peer_timeout = std::min(options.peer_timeout, options.connect_timeout);
  options.heartbeat = std::min(options.heartbeat, options.peer_timeout / 4);
  return std::make_unique<dist::DataParallel>(options, c.device);
}

LrSchedule lr_schedule_of(const TrainConfig& c) {
  return {.kind = c.lr_schedule,
          .base_lr = c.lr,
          .warmup_steps = c.warmup_steps,
          .step_size = c.lr_step_size,
          .gamma = c.lr_gamma};
}

std::vector<EpochResult> train_classifier(
    const TrainConfig& c, const std::function<void(const EpochResult&)>& on_epoch,
    const std::function<void(const std::vector<VariablePtr>&)>& on_finish) {
  check_config(c);
  std::unique_ptr<dist::DataParallel> parallel = join_data_parallel(c);
  try {
    ClassifierTraining training(c, parallel.get());
    std::vector<EpochResult> results = training.run(on_epoch);
    if (on_finish) on_finish(training.model().parameters());
    if (parallel) parallel->finish();
    return results;
  } catch (const std::exception& e) {
    if (parallel) parallel->report_error(e.what());  // the other ranks end with this rank's reason
    throw;
  }
}

}  // namespace kiln
