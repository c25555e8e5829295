// The GAN's step as bench times it: one discriminator step and one generator step (Adam,
// beta1 0.5), both queued before the host waits, on a GPU the next step queued before the
// last one's values are read, with the noise drawn on the host one step ahead on a worker
// thread and copied to the device while the step before runs, as the training loop does;
// also the process CPU time per step (all threads), which a loaded machine inflates less
// than wall time.
#include <fmt/format.h>
#include <time.h>

#include <chrono>

#include "core/env_switch.h"
#include "graph/op.h"
#include "models/gan.h"
#include "train/gan_steps.h"
#include "train/gan_task.h"
#include "train/tasks.h"

namespace kiln {
namespace {

double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

// `step`: data parallelism (bench --gpus: this rank's steps, each with its own noise).
TimedSteps time_gan_steps(const std::string& model, std::int64_t batch,
                          const CompileOptions& options, int warmup, int steps,
                          const TrainStepOptions& step, std::uint64_t seed) {
  Philox rng(0);
  std::unique_ptr<Gan> gan = make_gan(model, rng);
  const auto compile_start = std::chrono::steady_clock::now();
  GanSteps gan_steps(*gan, batch, {.name = "adam", .lr = kGanLr, .beta1 = kGanBeta1}, options,
                     step);
  TimedSteps timed{.compile_ms = ms_since(compile_start)};
  Tensor real = Tensor::empty({batch, 1, 28, 28}, DType::f32);
  Philox(seed).fill_uniform(real, -1, 1);
  std::vector<double> ms, device_ms;
  double cpu_ms = 0;
  NoiseAhead noise(batch, seed, !options.device.is_cpu());
  Tensor z = noise.take(0);
  // As the loop does on a GPU: step i queued before step i - 1's values are read (unless
  // KILN_STEP_AHEAD=0), so a step's time is from one step's values to the next's.
  const bool ahead = !options.device.is_cpu() && env_switch_on("KILN_STEP_AHEAD");
  QueuedGanStep queued;  // the step before, its values not read yet
  for (int i = 0; i < warmup + steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_ms();
    Tensor next = noise.take(static_cast<std::uint64_t>(i + 1));  // drawn during the last step
    gan_steps.prefetch(real, next);  // as the loop does: copied while this step computes
    QueuedGanStep step = gan_steps.enqueue(real, z);
    if (queued.valid()) queued.wait();
    queued = std::move(step);
    if (!ahead) {
      queued.wait();
      queued = {};
    }
    z = std::move(next);
    if (i < warmup) continue;
    cpu_ms += process_cpu_ms() - cpu_start;
    ms.push_back(ms_since(start));
    const double d_ms = gan_steps.discriminator_step().last_step_device_ms(),
                 g_ms = gan_steps.generator_step().last_step_device_ms();
    if (d_ms >= 0 && g_ms >= 0) device_ms.push_back(d_ms + g_ms);
  }
  if (queued.valid()) queued.wait();
  timed.times = {quantile(ms, 0.5), quantile(ms, 0.1), quantile(ms, 0.9)};
  if (!device_ms.empty()) timed.times.device_median_ms = quantile(device_ms, 0.5);
  timed.extras = {{"cpu_ms_per_step", cpu_ms / steps}};
  if (step.data_parallel_group >= 0) {  // bench --gpus: the all-reduces of both programs
    int all_reduces = 0;
    for (Program* p : {&gan_steps.discriminator_step(), &gan_steps.generator_step()})
      for (const Node& n : p->graph().nodes()) all_reduces += n.op->id == OpId::all_reduce_mean;
    timed.extras.emplace_back("all_reduce_ops", all_reduces);
  }
  return timed;
}

}  // namespace

BenchStep gan_bench_step(const TrainConfig& c, const TaskContext& context) {
  const std::string model = c.model;
  const std::int64_t batch = c.loop.batch_size;
  const TrainStepOptions step{
      .data_parallel_group = context.collective_group,
      .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
      .sync_batch_norm = c.parallel.sync_batch_norm};
  const std::uint64_t seed = 1 + static_cast<std::uint64_t>(context.rank);
  return {.label = fmt::format("{} D step + G step, batch {}, Adam", model, batch),
          .items = batch,
          .recorded = {},
          .feeds = {},
          .time = [model, batch, step, seed](const CompileOptions& options, int warmup, int steps) {
            return time_gan_steps(model, batch, options, warmup, steps, step, seed);
          }};
}

}  // namespace kiln
