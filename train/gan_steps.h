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

// A GAN step queued on the device (GanSteps::enqueue).
struct QueuedGanStep {
  PendingRun discriminator, generator;
  bool valid() const { return discriminator.valid(); }
  GanStepResult wait();  // waits for both programs (once)
};

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
  GanStepResult run(const Tensor& real, const Tensor& z) { return enqueue(real, z).wait(); }
  // The same step queued: the host may queue the next before it waits for this one (a
  // program's next run completes its last first, so at most two GAN steps are in flight).
  QueuedGanStep enqueue(const Tensor& real, const Tensor& z);
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
// each is drawn while the previous step runs, by worker threads that each draw a part of it:
// one thread's normal sampling took 0.2 ms for the MLP GAN's batch of 64 on an H100's host,
// longer than the step (0.13 ms on the device). On the CPU the workers would only compete with
// the step's own threads, so it draws in place. The same tensors as gan_noise, in any order
// of steps; a step out of sequence is drawn at once.
class NoiseAhead {
 public:
  // `parts`: the worker threads with `ahead` (0: about 1600 values each, at most a quarter
  // of the processors).
  NoiseAhead(std::int64_t batch, std::uint64_t seed, bool ahead, std::size_t parts = 0);
  ~NoiseAhead();
  NoiseAhead(const NoiseAhead&) = delete;
  NoiseAhead& operator=(const NoiseAhead&) = delete;
  Tensor take(std::uint64_t step);  // the noise of `step`; starts drawing step + 1's

 private:
  void work(std::size_t part);  // a worker thread: draws its part of each requested step

  std::int64_t batch_;
  std::uint64_t seed_;
  std::vector<std::thread> workers_;  // only with `ahead`
  std::mutex mutex_;
  std::condition_variable changed_;
  bool stop_ = false;
  std::uint64_t request_ = 0;  // requests made: the workers draw until they have done this many
  std::vector<std::uint64_t> done_;  // per worker: requests drawn
  std::uint64_t step_ = 0;           // of the last request
  Tensor drawn_;                     // its noise, complete once every worker has done it
};

}  // namespace kiln
