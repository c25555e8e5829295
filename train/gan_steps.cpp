// The discriminator and generator steps as two graphs over the same Variables.
#include "train/gan_steps.h"

#include <algorithm>
#include <cstdlib>

#include "core/env_switch.h"

#include "graph/nn/batch_norm.h"
#include "graph/nn/functional.h"
#include "graph/train_step.h"

namespace kiln {
namespace {

// Checkpoints key tensors by name; both optimizers call their state "optimizer.*".
void rename_state(const Optimizer& optimizer, const std::string& prefix) {
  const std::string old_prefix = "optimizer.";
  for (const VariablePtr& v : optimizer.state())
    if (v->name.rfind(old_prefix, 0) == 0)
      v->name = prefix + "." + v->name.substr(old_prefix.size());
}

// Logits [B, 1] on the host; counts entries on the side of 0 that `real` asks for.
std::int64_t count_correct(const Tensor& logits, bool real) {
  std::int64_t correct = 0;
  const float* l = logits.data<float>();
  for (std::int64_t i = 0; i < logits.numel(); ++i) correct += real ? l[i] > 0 : l[i] <= 0;
  return correct;
}

// --sync-batch-norm: both networks' batch norms over the global batch.
void sync_batch_norm_for(Gan& gan, const TrainStepOptions& step) {
  if (step.sync_batch_norm && step.data_parallel_group >= 0)
    nn::sync_batch_norm(gan, step.data_parallel_group);
}

}  // namespace

void record_discriminator_step(Graph& g, Gan& gan, std::int64_t batch, Optimizer& optimizer,
                               const TrainStepOptions& step) {
  KILN_CHECK(batch >= 1, "GAN batch size must be at least 1 (got {})", batch);
  sync_batch_norm_for(gan, step);
  const Value real = g.input("real", {batch, 1, 28, 28});
  const Value fake = detach(gan.generator()(g.input("z", {batch, kGanNoiseDim})));
  const Value real_logits = gan.discriminator()(real);
  const Value fake_logits = gan.discriminator()(fake);
  g.output("real_logits", real_logits);
  g.output("fake_logits", fake_logits);
  append_training_step(bce_with_logits(real_logits, 1.0) + bce_with_logits(fake_logits, 0.0),
                       gan.discriminator_parameters(), optimizer, step);
}

void record_generator_step(Graph& g, Gan& gan, std::int64_t batch, Optimizer& optimizer,
                           const TrainStepOptions& step) {
  KILN_CHECK(batch >= 1, "GAN batch size must be at least 1 (got {})", batch);
  sync_batch_norm_for(gan, step);
  const Value fake_logits =
      gan.discriminator()(gan.generator()(g.input("z", {batch, kGanNoiseDim})));
  append_training_step(bce_with_logits(fake_logits, 1.0), gan.generator_parameters(), optimizer,
                       step);
}

double discriminator_accuracy(const Outputs& d) {
  const Tensor& real_logits = d.at("real_logits");
  const Tensor& fake_logits = d.at("fake_logits");
  const std::int64_t correct = count_correct(real_logits, true) + count_correct(fake_logits, false);
  return static_cast<double>(correct) /
         static_cast<double>(real_logits.numel() + fake_logits.numel());
}

GanSteps::GanSteps(Gan& gan, std::int64_t batch, const OptimizerConfig& optimizer,
                   const CompileOptions& options, const TrainStepOptions& step)
    : d_optimizer_(make_optimizer(optimizer)),
      g_optimizer_(make_optimizer(optimizer)),
      sync_(env_switch_set("KILN_GAN_SYNC")) {
  {
    Graph g;
    record_discriminator_step(g, gan, batch, *d_optimizer_, step);
    d_step_ = compile(g, options);
  }
  {
    Graph g;
    record_generator_step(g, gan, batch, *g_optimizer_, step);
    g_step_ = compile(g, options);
  }
  rename_state(*d_optimizer_, "d_optimizer");
  rename_state(*g_optimizer_, "g_optimizer");
}

// Both steps are queued before the host waits (on the GPU they run back to back), unless
// KILN_GAN_SYNC=1 (the host waits for each: the path before, to measure against).
QueuedGanStep GanSteps::enqueue(const Tensor& real, const Tensor& z) {
  QueuedGanStep step{.discriminator = d_step_->enqueue({{"real", real}, {"z", z}})};
  if (sync_) step.discriminator.complete();
  step.generator = g_step_->enqueue({{"z", z}});
  return step;
}

GanStepResult QueuedGanStep::wait() {
  const Outputs d = discriminator.wait(), g = generator.wait();
  return {.d_loss = d.at("loss").item(),
          .g_loss = g.at("loss").item(),
          .d_accuracy = discriminator_accuracy(d)};
}

void GanSteps::prefetch(const Tensor& real, const Tensor& z) {
  if (sync_) return;
  d_step_->prefetch({{"real", real}, {"z", z}});
  g_step_->prefetch({{"z", z}});
}

std::vector<VariablePtr> GanSteps::optimizer_state() const {
  std::vector<VariablePtr> state = d_optimizer_->state();
  for (const VariablePtr& v : g_optimizer_->state()) state.push_back(v);
  return state;
}

void GanSteps::set_lr(double lr) {
  d_optimizer_->set_lr(lr);
  g_optimizer_->set_lr(lr);
}

namespace {

Philox noise_stream(std::uint64_t seed, std::uint64_t step) {
  return Philox(seed ^ 0x9a17'0000'0000'0000ULL, step << 32);
}

}  // namespace

Tensor gan_noise(std::int64_t batch, std::uint64_t seed, std::uint64_t step) {
  Tensor z = Tensor::empty({batch, kGanNoiseDim}, DType::f32);
  noise_stream(seed, step).fill_normal(z, 0.0, 1.0);
  return z;
}

NoiseAhead::NoiseAhead(std::int64_t batch, std::uint64_t seed, bool ahead, std::size_t parts)
    : batch_(batch), seed_(seed) {
  if (!ahead) return;
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  if (parts == 0)  // about 1600 values a part (0.05 ms)
    parts = std::clamp<std::size_t>(static_cast<std::size_t>(batch * kGanNoiseDim / 1600), 1,
                                    std::max<std::size_t>(1, cores / 4));
  done_.assign(parts, 0);
  for (std::size_t k = 0; k < parts; ++k) workers_.emplace_back([this, k] { work(k); });
}

NoiseAhead::~NoiseAhead() {
  if (workers_.empty()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void NoiseAhead::work(std::size_t part) {
  const std::int64_t n = batch_ * kGanNoiseDim, parts = static_cast<std::int64_t>(done_.size());
  // Even boundaries: a part never splits a Box-Muller pair.
  const std::int64_t begin = n * static_cast<std::int64_t>(part) / parts / 2 * 2,
                     end = part + 1 == done_.size()
                               ? n
                               : n * static_cast<std::int64_t>(part + 1) / parts / 2 * 2;
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stop_ || done_[part] < request_; });
    if (stop_) return;
    const std::uint64_t step = step_, request = request_;
    Tensor z = drawn_;  // shares the storage: each part writes its own elements
    lock.unlock();
    noise_stream(seed_, step).fill_normal_part(z, 0.0, 1.0, begin, end);
    lock.lock();
    done_[part] = request;
    changed_.notify_all();
  }
}

Tensor NoiseAhead::take(std::uint64_t step) {
  if (workers_.empty()) return gan_noise(batch_, seed_, step);
  std::unique_lock lock(mutex_);
  const auto drawn = [this] {
    return std::all_of(done_.begin(), done_.end(), [&](std::uint64_t d) { return d == request_; });
  };
  changed_.wait(lock, drawn);  // a draw in flight finishes first
  Tensor z = request_ > 0 && step_ == step ? std::move(drawn_) : gan_noise(batch_, seed_, step);
  drawn_ = Tensor::empty({batch_, kGanNoiseDim}, DType::f32);
  step_ = step + 1;
  ++request_;
  changed_.notify_all();
  return z;
}

}  // namespace kiln
