// train(): the loop over epochs and steps, the same for every task.
#include "train/loop.h"

#include <algorithm>
#include <array>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>

#include "core/env_switch.h"
#include "core/log.h"
#include "distributed/data_parallel.h"
#include "train/checkpoint.h"
#include "train/divergence.h"
#include "train/flags.h"
#include "train/progress.h"
#include "train/saved_classifier.h"
#include "train/step_lines.h"
#include "train/step_trace.h"
#include "train/tasks.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check_config(const TrainConfig& c) {
  validate_config(c);
  lr_schedule_of(c.loop).validate();
  const ParallelSettings& p = c.parallel;
  KILN_CHECK(p.rank < p.world_size, "--rank {} is not a rank of --world-size {}", p.rank,
             p.world_size);
  if (!c.loop.checkpoint.empty() && p.rank == 0)
    check_checkpoint_directory(c.loop.checkpoint);  // fail now, not after an epoch of work
}

// This process's place in the config's data-parallel job (joined now), or null for one.
std::unique_ptr<dist::DataParallel> join_data_parallel(const TrainConfig& c, Device device) {
  if (c.parallel.world_size <= 1) return nullptr;
  dist::ProcessGroupOptions options{.rank = c.parallel.rank,
                                    .world_size = c.parallel.world_size,
                                    .address = c.parallel.init,
                                    .connect_timeout = std::chrono::milliseconds(
                                        static_cast<std::int64_t>(c.parallel.init_timeout * 1000))};
  options.peer_timeout = std::min(options.peer_timeout, options.connect_timeout);
  options.heartbeat = std::min(options.heartbeat, options.peer_timeout / 4);
  return std::make_unique<dist::DataParallel>(options, device);
}

TaskContext task_context(const TrainConfig& c, dist::DataParallel* parallel) {
  TaskContext context{.options = compile_options(c.device)};
  if (parallel == nullptr) {
    if (c.parallel.sync_batch_norm)
      log().warn("--sync-batch-norm: one process, whose batch is the global batch already");
    return context;
  }
  // Every rank trains a shard of the same size: the global batch is the batch times the ranks,
  // and synchronised batch norm and dropout take the ranks' shards as equal parts of it.
  std::array<double, 3> shard = {static_cast<double>(c.loop.batch_size),
                                 static_cast<double>(c.lm.seq_len),
                                 static_cast<double>(c.loop.accumulate)};
  const std::array<double, 3> mine = shard;
  parallel->group().all_reduce_mean(shard);
  KILN_CHECK(shard == mine,
             "rank {}: --batch-size {}, --seq-len {} and --accumulate {} are not every rank's: "
             "all ranks must train steps of one shape",
             parallel->rank(), c.loop.batch_size, c.lm.seq_len, c.loop.accumulate);
  context.rank = parallel->rank();
  context.world_size = parallel->world_size();
  context.collective_group = parallel->collective_group();
  context.average = [parallel](std::span<double> v) { parallel->group().all_reduce_mean(v); };
  return context;
}

// A step whose programs are queued (on a GPU, computing) and whose values the host has not
// read: the loop queues the next step before it reads them, so that the host's work between
// steps (the values, metrics, the next batch) overlaps the device's.
struct QueuedStep {
  std::int64_t epoch = 0, batch = 0, done = 0;  // done: the run's steps before this one
  double lr = 0;
  std::vector<std::vector<PendingRun>> runs;  // per micro-batch, per program
  std::unique_ptr<StepTrace> trace;           // of its first micro-batch, where traced
  double data_wait = 0;                       // seconds this thread spent getting its batches
};

// One training run: everything the epochs share.
class Loop {
 public:
  Loop(const TrainConfig& c, dist::DataParallel* parallel)
      : c_(c),
        parallel_(parallel),
        leader_(c.parallel.rank == 0),
        task_(task_entry(c.model).make(c, task_context(c, parallel))),
        schedule_(lr_schedule_of(c.loop)),
        metrics_(c.loop.metrics.empty() || !leader_
                     ? std::make_unique<MetricsWriter>()
                     : std::make_unique<MetricsWriter>(c.loop.metrics)),
        lines_(*metrics_, task_->examples_per_step() * c.loop.accumulate, c.loop.metrics_every) {
    KILN_CHECK(steps_per_epoch() >= 1,
               "--accumulate {}: an epoch has only {} batches of {} (fewer than one step)",
               c.loop.accumulate, task_->steps_per_epoch(), c.loop.batch_size);
    const std::int64_t all = c.loop.epochs * steps_per_epoch();
    last_ = c.loop.max_steps >= 0 ? std::min(c.loop.max_steps, all) : all;
    horizon_ = task_->max_steps_sets_horizon() ? last_ : all;
    // The CPU runs a step as it is queued: queuing the next first would only run it before the
    // last one's values are checked. KILN_STEP_AHEAD=0: each step's values are read before the
    // next is queued (the path before, to measure against).
    step_ahead_ = !compile_options(c.device).device.is_cpu() && env_switch_on("KILN_STEP_AHEAD");
  }

  std::vector<EpochReport> run(const std::function<void(const EpochReport&)>& on_epoch);
  const Task& task() const { return *task_; }

 private:
  // A step's micro-batches (--accumulate): the task's batches come in groups of that many,
  // the partial group at an epoch's end dropped.
  std::int64_t micro() const { return c_.loop.accumulate; }
  std::int64_t steps_per_epoch() const { return task_->steps_per_epoch() / micro(); }
  void resume();
  void check_position(const TrainingPosition& at) const;
  void check_steps_left(const TrainingPosition& at) const;
  void save(const TrainingPosition& at);
  TrainingPosition after(std::int64_t epoch, std::int64_t batch, std::int64_t done) const {
    return batch == steps_per_epoch() ? TrainingPosition{done, epoch + 1, 0}
                                      : TrainingPosition{done, epoch, batch};
  }
  bool traced(std::int64_t done) const {
    return !c_.loop.trace.empty() && leader_ && done == std::min<std::int64_t>(9, last_ - 1);
  }
  // After `steps` steps of the run: a periodic save, a replica check.
  bool saves_after(std::int64_t steps) const {
    return c_.loop.save_every > 0 && steps % c_.loop.save_every == 0;
  }
  bool checks_replicas_after(std::int64_t steps) const {
    return c_.parallel.check_replicas > 0 && steps % c_.parallel.check_replicas == 0;
  }
  bool may_queue_after(std::int64_t done) const;
  QueuedStep queue_step(std::int64_t epoch, std::int64_t batch, std::int64_t first,
                        std::int64_t end);
  StepValues finish_step(QueuedStep& s);
  void add_loss_scale_values(const std::vector<Outputs>& outputs, StepValues& v);
  EpochReport run_epoch(std::int64_t epoch, std::int64_t first, std::int64_t end);
  void evaluate(EpochReport& r);
  void check_replicas(std::int64_t step);

  const TrainConfig& c_;
  dist::DataParallel* parallel_;
  bool leader_;  // rank 0: saves, evaluates, reports
  std::unique_ptr<Task> task_;
  LrSchedule schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  StepLines lines_;
  DivergenceCheck divergence_;
  std::vector<std::vector<Feed>> next_;  // the next batch's feeds, filled (and prefetched) ahead
  TrainingPosition start_;
  std::int64_t total_ = 0;    // steps done, over the whole run
  std::int64_t last_ = 0;     // the step the run stops after
  std::int64_t horizon_ = 0;  // the schedule's length
  double lr_ = 0;             // of the last step queued
  bool step_ahead_ = false;   // queue a step before reading the last one's values (a GPU's)
};

void Loop::resume() {
  if (c_.loop.resume.empty()) return;
  const Checkpoint checkpoint(c_.loop.resume);
  check_resumable(c_, checkpoint);
  start_ = checkpoint.position();
  check_position(start_);
  const TaskState s = task_->state();
  checkpoint.restore(s.parameters, s.optimizer_state, s.buffers);
  check_steps_left(start_);
  log().info("resumed from {} at epoch {} batch {} (step {})", c_.loop.resume, start_.epoch,
             start_.batch, start_.step);
}

// A resumed position must be one of this run's data, with steps left to train.
void Loop::check_position(const TrainingPosition& at) const {
  const std::string& path = c_.loop.resume;
  const std::int64_t per_epoch = steps_per_epoch();
  KILN_CHECK(at.batch < per_epoch,
             "--resume {}: its position is batch {} of epoch {}, but an epoch of this run has {} "
             "batches (is the data the same as the run that wrote it?)",
             path, at.batch, at.epoch, per_epoch);
  KILN_CHECK(at.epoch <= kMaxCheckpointSteps / per_epoch &&
                 at.step == (at.epoch - 1) * per_epoch + at.batch,
             "--resume {}: its position is inconsistent: step {} is not batch {} of epoch {} at {} "
             "batches per epoch (is the data the same as the run that wrote it?)",
             path, at.step, at.batch, at.epoch, per_epoch);
}

// A resumed run that would train nothing is refused (it used to exit 0 without a word).
void Loop::check_steps_left(const TrainingPosition& at) const {
  const std::string& path = c_.loop.resume;
  KILN_CHECK(at.epoch <= c_.loop.epochs,
             "--resume {}: the checkpoint is at the end of epoch {} (step {}): nothing is left to "
             "train in --epochs {} (raise --epochs)",
             path, at.epoch - 1, at.step, c_.loop.epochs);
  KILN_CHECK(c_.loop.max_steps < 0 || at.step < c_.loop.max_steps,
             "--resume {}: the checkpoint is at step {}: nothing is left to train with --max-steps "
             "{} (raise --max-steps)",
             path, at.step, c_.loop.max_steps);
}

// Checks the state for NaN and Inf first (on every rank, as the replicas are identical), so
// that no checkpoint with a non-finite value is ever written.
void Loop::save(const TrainingPosition& at) {
  const TaskState s = task_->state();
  const std::string& path = c_.loop.checkpoint;
  std::string consequence;
  if (!path.empty())
    consequence = fmt::format(": the checkpoint {} was not written{}", path,
                              std::filesystem::exists(path) ? " (the previous one is kept)" : "");
  DivergenceCheck::check_state(s, fmt::format("after step {} of the run", at.step), consequence);
  if (path.empty() || !leader_) return;  // the replicas are identical: rank 0 writes
  std::map<std::string, std::string> metadata = training_metadata(c_);
  metadata.merge(task_->metadata());
  save_checkpoint(path, s.parameters, s.optimizer_state, at, metadata, s.buffers);
}

// Data parallelism: every variable (parameters, optimizer state, buffers) equal on all ranks.
void Loop::check_replicas(std::int64_t step) {
  if (parallel_ == nullptr) return;
  const TaskState s = task_->state();
  std::vector<VariablePtr> vars = s.parameters;
  for (const std::vector<VariablePtr>* more : {&s.optimizer_state, &s.buffers})
    vars.insert(vars.end(), more->begin(), more->end());
  parallel_->check_replicas(vars, step);
}

// The fp16 loss scaler's outputs (graph/loss_scale.h) in the step's values, so that the
// metrics lines show them: "loss_scale" and "skipped_steps", prefixed by the program's name
// after the first (a GAN's generator step).
void Loop::add_loss_scale_values(const std::vector<Outputs>& outputs, StepValues& v) {
  const std::vector<StepProgram> programs = task_->programs();
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    std::string prefix = i == 0 ? "" : programs[i].name + "_";
    std::replace(prefix.begin(), prefix.end(), ' ', '_');
    for (const char* name : {"loss_scale", "skipped_steps"})
      if (auto it = outputs[i].find(name); it != outputs[i].end())
        v.extras.emplace_back(prefix + name, it->second.item());
  }
}

// Whether step `done` (counted over the run from 0) may stay queued while the next one is
// queued: not where the host reads or writes the state after it (a save, a replica check),
// where either step is traced (a trace times its step alone), nor on the CPU.
bool Loop::may_queue_after(std::int64_t done) const {
  return step_ahead_ && !saves_after(done + 1) && !checks_replicas_after(done + 1) &&
         !traced(done) && !traced(done + 1);
}

// Queues batch `batch` of the epoch (whose batches [first, end) this run trains): the task's
// micro-batches batch * micro() ..., its step programs once each. Their batches are filled
// (and the next one's prefetched) first; a GAN's generator step follows its discriminator
// step on the device without a round trip through the host.
QueuedStep Loop::queue_step(std::int64_t epoch, std::int64_t batch, std::int64_t first,
                            std::int64_t end) {
  QueuedStep s{.epoch = epoch, .batch = batch, .done = total_ + (batch - first)};
  lr_ = s.lr = schedule_.at(s.done, horizon_);
  task_->set_lr(lr_);
  const std::vector<StepProgram> programs = task_->programs();
  for (std::int64_t k = 0; k < micro(); ++k) {
    const std::int64_t at = batch * micro() + k, run = s.done * micro() + k;  // the task's
    // The time this thread spends getting batches (filling them, or waiting for a loader
    // that fills them ahead) is the step's data wait.
    auto fetch_start = Clock::now();
    std::vector<std::vector<Feed>> feeds =
        batch == first && k == 0 ? task_->feeds(at, run) : std::move(next_);
    s.data_wait += seconds_since(fetch_start);
    if (k + 1 < micro() || batch + 1 < end) {  // a GPU copies the next batch meanwhile
      fetch_start = Clock::now();
      next_ = task_->feeds(at + 1, run + 1);
      s.data_wait += seconds_since(fetch_start);
      for (std::size_t i = 0; i < programs.size(); ++i) programs[i].program->prefetch(next_[i]);
    }
    if (traced(s.done) && k == 0) s.trace = std::make_unique<StepTrace>(c_.loop.trace, programs);
    std::vector<PendingRun>& runs = s.runs.emplace_back();
    try {
      for (std::size_t i = 0; i < programs.size(); ++i)
        runs.push_back(programs[i].program->enqueue(feeds[i]));
    } catch (const Error& e) {
      throw Error(fmt::format("epoch {} step {}: {}", epoch, batch + 1, e.what()));
    }
  }
  return s;
}

// Waits for a queued step and reads its values: the means of its micro-batches' losses and
// values (the loss scaler's, of the last run: the one that updates), checked for divergence
// and recorded in the metrics.
StepValues Loop::finish_step(QueuedStep& s) {
  StepValues v;
  for (std::size_t k = 0; k < s.runs.size(); ++k) {
    std::vector<Outputs> outputs;
    try {
      for (PendingRun& r : s.runs[k]) outputs.push_back(r.wait());
      if (k == 0 && s.trace) s.trace->finish();
    } catch (const Error& e) {
      throw Error(fmt::format("epoch {} step {}: {}", s.epoch, s.batch + 1, e.what()));
    }
    const StepValues part = task_->step_values(outputs);
    v.loss += part.loss / static_cast<double>(micro());
    if (v.extras.empty()) v.extras = Values(part.extras.size(), {"", 0.0});
    for (std::size_t i = 0; i < part.extras.size(); ++i)
      v.extras[i] = {part.extras[i].first,
                     v.extras[i].second + part.extras[i].second / static_cast<double>(micro())};
    if (k + 1 == s.runs.size()) add_loss_scale_values(outputs, v);
  }
  v.extras.emplace_back("data_wait_ms", 1000 * s.data_wait);
  divergence_.check_step(v, s.epoch, s.batch + 1);
  lines_.record(s.done + 1, s.epoch, v, s.lr, s.done + 1 == last_);
  if (checks_replicas_after(s.done + 1)) check_replicas(s.done + 1);
  return v;
}

// Trains batches [first, end) of `epoch`, saves, evaluates.
EpochReport Loop::run_epoch(std::int64_t epoch, std::int64_t first, std::int64_t end) {
  EpochReport r{.epoch = epoch, .steps = end - first};
  const bool show_progress = c_.loop.progress && leader_;
  Progress progress(fmt::format("epoch {}/{}", epoch, c_.loop.epochs), r.steps,
                    show_progress && stderr_is_terminal());
  const double examples = static_cast<double>(task_->examples_per_step() * micro());
  double loss_sum = 0;
  const auto clock_start = Clock::now();
  lines_.restart_clock();
  // A step's values, once read: the epoch's sums, the progress line, the periodic save.
  const auto take = [&](QueuedStep& s) {
    const StepValues v = finish_step(s);
    loss_sum += v.loss;
    if (r.values.empty())
      r.values = v.extras;
    else
      for (std::size_t i = 0; i < v.extras.size(); ++i) r.values[i].second += v.extras[i].second;
    const std::int64_t in_epoch = s.batch + 1 - first, done = s.done + 1;
    if (show_progress)
      progress.update(in_epoch, loss_sum / static_cast<double>(in_epoch),
                      static_cast<double>(in_epoch) * examples / seconds_since(clock_start));
    if (saves_after(done)) save(after(epoch, s.batch + 1, done));
  };
  std::optional<QueuedStep> queued;  // the step before, its values not read yet
  for (std::int64_t b = first; b < end; ++b) {
    QueuedStep s;
    try {
      s = queue_step(epoch, b, first, end);
    } catch (...) {  // the step before is recorded first (or its own error, which came first)
      if (queued) take(*queued);
      throw;
    }
    if (queued) take(*queued);  // while step b computes
    queued = std::move(s);
    if (!may_queue_after(queued->done)) {
      take(*queued);
      queued.reset();
    }
  }
  if (queued) take(*queued);
  if (show_progress) progress.finish();
  r.seconds = seconds_since(clock_start);
  r.examples_per_second = static_cast<double>(r.steps) * examples / r.seconds;
  r.loss = loss_sum / static_cast<double>(r.steps);
  for (auto& [name, sum] : r.values) sum /= static_cast<double>(r.steps);
  total_ += r.steps;
  r.step = total_;
  r.lr = lr_;
  save(after(epoch, end, total_));
  if (leader_) evaluate(r);  // rank 0 evaluates the (identical) model
  return r;
}

// The task's evaluation, then the epoch's line of the metrics.
void Loop::evaluate(EpochReport& r) {
  const Values evaluation = task_->evaluate(r.epoch, r.files);
  DivergenceCheck::check_evaluation(evaluation, r.epoch);
  r.values.insert(r.values.end(), evaluation.begin(), evaluation.end());
  std::map<std::string, MetricsWriter::Field> fields = {
      {"epoch", r.epoch}, {"step", r.step},       {"loss", r.loss},
      {"lr", r.lr},       {"seconds", r.seconds}, {"examples_per_second", r.examples_per_second}};
  for (const auto& [name, value] : r.values) fields[name] = value;
  for (const auto& [name, path] : r.files) fields[name] = path;
  metrics_->write("epoch", fields);
}

std::vector<EpochReport> Loop::run(const std::function<void(const EpochReport&)>& on_epoch) {
  resume();
  total_ = start_.step;
  check_replicas(total_);  // the same initialisation (or checkpoint) on every rank
  std::vector<EpochReport> reports;
  for (std::int64_t epoch = start_.epoch; epoch <= c_.loop.epochs; ++epoch) {
    task_->start_epoch(epoch);
    const std::int64_t first = epoch == start_.epoch ? start_.batch : 0;  // a resumed epoch
    const std::int64_t end = std::min(steps_per_epoch(), first + last_ - total_);
    if (end <= first) break;
    reports.push_back(run_epoch(epoch, first, end));
    if (on_epoch) on_epoch(reports.back());
  }
  return reports;
}

}  // namespace

double EpochReport::value(const std::string& name) const {
  for (const auto& [key, v] : values)
    if (key == name) return v;
  throw Error(fmt::format("epoch {} has no value '{}'", epoch, name));
}

bool EpochReport::has(const std::string& name) const {
  for (const auto& [key, v] : values)
    if (key == name) return true;
  return false;
}

std::vector<EpochReport> train(const TrainConfig& c,
                               const std::function<void(const EpochReport&)>& on_epoch,
                               const std::function<void(const TaskState&)>& on_finish) {
  check_config(c);
  std::unique_ptr<dist::DataParallel> parallel =
      join_data_parallel(c, compile_options(c.device).device);
  try {
    Loop loop(c, parallel.get());
    std::vector<EpochReport> reports = loop.run(on_epoch);
    if (on_finish) on_finish(loop.task().state());
    if (parallel) parallel->finish();
    return reports;
  } catch (const std::exception& e) {
    if (parallel) parallel->report_error(e.what());  // the other ranks end with this rank's reason
    throw;
  }
}

}  // namespace kiln
