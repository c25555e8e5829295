// A GAN's two compiled training steps, which share the parameter Variables (DESIGN.md):
// the discriminator step (real images labelled 1, the generator's detached output labelled
// 0; updates D only) and the generator step (D(G(z)) labelled 1; updates G only).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

#include <memory>
#include <vector>

#include "backends/compile.h"
#include "models/gan.h"
#include "train/step_graph.h"

namespace kiln {

struct GanStepResult {
  double d_loss = 0;      // BCE on the real batch plus BCE on the fake batch
  double g_loss = 0;      // BCE of D(G(z)) against 1
  double d_accuracy = 0;  // fraction of real and fake images D classified right (logit > 0: real)
};

// The two training steps recorded into `g` (GanSteps compiles them; dump shows them).
// Discriminator: feeds "real" [B, 1, 28, 28] and "z" [B, 100], outputs "loss",
// "real_logits", "fake_logits", updates D. Generator: feeds "z", outputs "loss", updates G.
// `step`: data parallelism (both steps average their gradients and losses over the ranks).
void record_discriminator_step(Graph& g, Gan& gan, std::int64_t batch, Optimizer& optimizer,
                               const TrainStepOptions& step = {});
void record_generator_step(Graph& g, Gan& gan, std::int64_t batch, Optimizer& optimizer,
                           const TrainStepOptions& step = {});

// The fraction of real and fake images the discriminator step's outputs classified right
// (logit > 0: real).
double discriminator_accuracy(const Outputs& discriminator_outputs);

class GanSteps {
 public:
  // Records and compiles both steps at `batch` for `gan` (which must outlive this), each with
  // its own optimizer made from `optimizer`.
  GanSteps(Gan& gan, std::int64_t batch, const OptimizerConfig& optimizer,
           const CompileOptions& options, const TrainStepOptions& step = {});

  // One discriminator step on (real [B, 1, 28, 28], z [B, 100]), then one generator step on
  // the same z (the generator has not changed, so it sees the fakes D was just trained on).
  // Both are queued before the host waits once (Program::enqueue): on the GPU the generator
  // step starts on the device as soon as the discriminator step ends. KILN_GAN_SYNC=1 makes
  // the host wait for the discriminator step first and prefetch() do nothing (the path
  // before, to measure against).
  GanStepResult run(const Tensor& real, const Tensor& z);
  // Announces the next run's (real, z): on the GPU they are copied to the device while this
  // run computes (Program::prefetch); they must not change until that run.
  void prefetch(const Tensor& real, const Tensor& z);

  Program& discriminator_step() {
    return *d_step_;
  }  // feeds "real", "z"; outputs "loss", "real_logits", "fake_logits"
  Program& generator_step() { return *g_step_; }  // feeds "z"; outputs "loss"
  // Both optimizers' state, named "d_optimizer.*" and "g_optimizer.*" (for checkpoints).
  std::vector<VariablePtr> optimizer_state() const;
  void set_lr(double lr);

 private:
  std::unique_ptr<Optimizer> d_optimizer_, g_optimizer_;
  std::unique_ptr<Program> d_step_, g_step_;
  bool sync_ = false;  // KILN_GAN_SYNC=1: wait between the steps, no prefetch (to measure)
};

// Standard normal noise [batch, 100] for training step `step`: a pure function of (seed,
// step), so a resumed run draws the same noise without saving any RNG state.
Tensor gan_noise(std::int64_t batch, std::uint64_t seed, std::uint64_t step);

// gan_noise of consecutive steps. With `ahead` (for GPU steps, which leave the host idle),
// each is drawn on a worker thread while the previous step runs: the host's normal sampling
// is a third of the MLP GAN's step on an H200. On the CPU the worker would only compete with
// the step's own threads, so it draws in place. The same tensors as gan_noise, in any order
// of steps; a step out of sequence is drawn at once.
class NoiseAhead {
 public:
  NoiseAhead(std::int64_t batch, std::uint64_t seed, bool ahead);
  ~NoiseAhead();
  NoiseAhead(const NoiseAhead&) = delete;
  NoiseAhead& operator=(const NoiseAhead&) = delete;
  Tensor take(std::uint64_t step);  // the noise of `step`; starts drawing step + 1's

 private:
  void work();  // the worker thread: draws each requested step

  std::int64_t batch_;
  std::uint64_t seed_;
  std::thread worker_;  // only with `ahead`
  std::mutex mutex_;
  std::condition_variable changed_;
  bool requested_ = false, ready_ = false, stop_ = false;
  std::uint64_t step_ = 0;  // requested or drawn
  Tensor drawn_;
};

}  // namespace kiln
