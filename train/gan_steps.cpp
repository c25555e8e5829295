// The discriminator and generator steps as two graphs over the same Variables.
#include "train/gan_steps.h"

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
GanStepResult GanSteps::run(const Tensor& real, const Tensor& z) {
  PendingRun d_run = d_step_->enqueue({{"real", real}, {"z", z}});
  if (sync_) d_run.complete();
  PendingRun g_run = g_step_->enqueue({{"z", z}});
  const Outputs d = d_run.wait(), g = g_run.wait();
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

Tensor gan_noise(std::int64_t batch, std::uint64_t seed, std::uint64_t step) {
  Tensor z = Tensor::empty({batch, kGanNoiseDim}, DType::f32);
  Philox(seed ^ 0x9a17'0000'0000'0000ULL, step << 32).fill_normal(z, 0.0, 1.0);
  return z;
}

NoiseAhead::NoiseAhead(std::int64_t batch, std::uint64_t seed, bool ahead)
    : batch_(batch), seed_(seed) {
  if (ahead) worker_ = std::thread([this] { work(); });
}

NoiseAhead::~NoiseAhead() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void NoiseAhead::work() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stop_ || requested_; });
    if (stop_) return;
    const std::uint64_t step = step_;
    lock.unlock();
    Tensor z = gan_noise(batch_, seed_, step);
    lock.lock();
    drawn_ = std::move(z);
    requested_ = false;
    ready_ = true;
    changed_.notify_all();
  }
}

Tensor NoiseAhead::take(std::uint64_t step) {
  if (!worker_.joinable()) return gan_noise(batch_, seed_, step);
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !requested_; });  // a draw in flight finishes first
  Tensor z = ready_ && step_ == step ? std::move(drawn_) : gan_noise(batch_, seed_, step);
  ready_ = false;
  step_ = step + 1;
  requested_ = true;
  changed_.notify_all();
  return z;
}

}  // namespace kiln
