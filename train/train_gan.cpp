// train_gan: data in [-1, 1], the GAN and its two steps, the loop, grids, FID, checkpoints.
#include "train/train_gan.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/log.h"
#include "train/checkpoint.h"
#include "data/dataset.h"
#include "train/fid.h"
#include "train/gan_steps.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/png_grid.h"
#include "train/progress.h"
#include "models/registry.h"

namespace kiln {
namespace {

constexpr std::int64_t kSampleBatch = 500;  // generator batch for grids and FID samples

// Uniform images in [-1, 1] (tests, benchmarks).
Dataset synthetic_gan_images(std::int64_t n, std::uint64_t seed) {
  Dataset d = synthetic_images(n, {1, 28, 28}, 10, seed);
  Philox(seed).fill_uniform(d.images, -1.0, 1.0);
  return d;
}

// Standard normal noise [n, 100] from its own stream (the grid's and the FID's fixed batches).
Tensor fixed_noise(std::int64_t n, std::uint64_t seed) {
  Tensor z = Tensor::empty({n, kGanNoiseDim}, DType::f32);
  Philox(seed).fill_normal(z, 0.0, 1.0);
  return z;
}

// The generator alone (samples for grids and FID), compiled per batch size.
class Sampler {
 public:
  Sampler(Gan& gan, const CompileOptions& options) : gan_(gan), options_(options) {}

  Tensor generate(const Tensor& z) {
    const std::int64_t n = z.shape()[0];
    Tensor images = Tensor::empty({n, 1, 28, 28}, DType::f32);
    for (std::int64_t begin = 0; begin < n; begin += kSampleBatch) {
      const std::int64_t count = std::min(kSampleBatch, n - begin);
      Tensor part = images.narrow_rows(begin, count);
      part.copy_from(program_for(count).run({{"z", z.narrow_rows(begin, count)}}).at("images"));
    }
    return images;
  }

 private:
  Program& program_for(std::int64_t count) {
    std::unique_ptr<Program>& slot = programs_[count];
    if (!slot) {
      Graph g;
      gan_.generator().set_training(false);  // batch norm reads its running statistics
      g.output("images", gan_.generator()(g.input("z", {count, kGanNoiseDim})));
      gan_.generator().set_training(true);
      slot = compile(g, options_);
    }
    return *slot;
  }

  Gan& gan_;
  CompileOptions options_;
  std::map<std::int64_t, std::unique_ptr<Program>> programs_;
};

CompileOptions compile_options(const TrainConfig& c) {
  return {.device = c.device,
          .cuda_graphs = c.cuda_graphs,
          .tf32 = c.tf32,
          .cuda_streams = c.cuda_streams,
          .check_numerics = c.check_numerics,
          .deterministic = c.deterministic};
}

OptimizerConfig optimizer_config(const TrainConfig& c) {
  return {.name = c.optimizer,
          .lr = c.lr,
          .momentum = c.momentum,
          .weight_decay = c.weight_decay,
          .beta1 = kGanBeta1};
}

std::unique_ptr<Gan> build_gan(const TrainConfig& c) {
  Philox rng(c.seed);
  return make_gan(c.model, rng);
}

}  // namespace

std::string gan_samples_path(const TrainConfig& c, std::int64_t epoch) {
  return (std::filesystem::path(c.samples_dir) / fmt::format("{}-epoch-{}.png", c.model, epoch))
      .string();
}

namespace {

class GanRun {
 public:
  explicit GanRun(const TrainConfig& c);
  std::vector<GanEpochResult> run(const std::function<void(const GanEpochResult&)>& on_epoch);
  std::vector<VariablePtr> variables() const {  // parameters, then buffers
    std::vector<VariablePtr> all = gan_->parameters();
    for (const VariablePtr& b : gan_->buffers()) all.push_back(b);
    return all;
  }

 private:
  GanEpochResult train_epoch(std::int64_t epoch, std::int64_t first, std::int64_t end);
  void evaluate(GanEpochResult& r);
  void save(const TrainingPosition& at) const;
  TrainingPosition after(std::int64_t epoch, std::int64_t batch, std::int64_t done) const {
    return batch == batcher_.batches_per_epoch() ? TrainingPosition{done, epoch + 1, 0}
                                                 : TrainingPosition{done, epoch, batch};
  }

  const TrainConfig& c_;
  Dataset train_, test_;
  std::unique_ptr<Gan> gan_;
  GanSteps steps_;
  Sampler sampler_;
  Batcher batcher_;
  LrSchedule schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<FidScorer> fid_;
  GaussianFit fid_reference_;
  NoiseAhead noise_;
  TrainingPosition start_;
  std::int64_t planned_steps_ = 0;
};

Dataset load_split(const TrainConfig& c, Split split) {
  if (c.synthetic)
    return synthetic_gan_images(split == Split::train ? 4096 : 1000,
                                c.seed + (split == Split::train ? 0 : 1));
  return load_fashion_mnist(c.data_dir.empty() ? kFashionMnistDir : c.data_dir, split,
                            PixelScale::symmetric);
}

GanRun::GanRun(const TrainConfig& c)
    : c_(c),
      train_(load_split(c, Split::train)),
      test_(load_split(c, Split::test)),
      gan_(build_gan(c)),
      steps_(*gan_, c.batch_size, optimizer_config(c), compile_options(c)),
      sampler_(*gan_, compile_options(c)),
      batcher_(train_, c.batch_size, true, c.seed),
      schedule_(lr_schedule_of(c)),
      noise_(c.batch_size, c.seed, !c.device.is_cpu()) {
  schedule_.validate();
  metrics_ = c.metrics_path.empty() ? std::make_unique<MetricsWriter>()
                                    : std::make_unique<MetricsWriter>(c.metrics_path);
  if (!c.fid_classifier
           .empty()) {  // the reference statistics first: a bad classifier fails before training
    fid_ = std::make_unique<FidScorer>(c.fid_classifier, compile_options(c));
    fid_reference_ = fid_->fit(test_.images.narrow_rows(0, std::min(kFidSamples, test_.size())));
  }
  if (!c.resume_path.empty()) {
    start_ = load_checkpoint(c.resume_path, gan_->parameters(), steps_.optimizer_state(), nullptr,
                             gan_->buffers());
    log().info("resumed from {} at epoch {} batch {} (step {})", c.resume_path, start_.epoch,
               start_.batch, start_.step);
  }
  const std::int64_t all = c.epochs * batcher_.batches_per_epoch();
  planned_steps_ = c.max_steps >= 0 ? std::min(c.max_steps, all) : all;
}

GanEpochResult GanRun::train_epoch(std::int64_t epoch, std::int64_t first, std::int64_t end) {
  GanEpochResult r{.epoch = epoch, .steps = end - first};
  Tensor real = Tensor::empty({c_.batch_size, 1, 28, 28}, DType::f32);
  Tensor labels = Tensor::empty({c_.batch_size}, DType::i64);
  Progress progress(fmt::format("epoch {}/{}", epoch, c_.epochs), r.steps,
                    c_.progress && stderr_is_terminal());
  const std::int64_t done_before = start_.step;
  const auto clock_start = std::chrono::steady_clock::now();
  for (std::int64_t b = first; b < end; ++b) {
    const std::int64_t done = done_before + (b - first);  // steps before this one
    const double lr = schedule_.at(done, planned_steps_);
    steps_.set_lr(lr);
    batcher_.fill(b, real, labels);
    GanStepResult s;
    try {
      s = steps_.run(real, noise_.take(static_cast<std::uint64_t>(done)));
    } catch (const Error& e) {
      throw Error(fmt::format("epoch {} step {}: {}", epoch, b + 1, e.what()));
    }
    KILN_CHECK(std::isfinite(s.d_loss) && std::isfinite(s.g_loss),
               "training diverged: discriminator loss {}, generator loss {} at epoch {} step {} "
               "(lower the learning rate)",
               s.d_loss, s.g_loss, epoch, b + 1);
    r.d_loss += s.d_loss;
    r.g_loss += s.g_loss;
    r.d_accuracy += s.d_accuracy;
    metrics_->write("step", {{"step", done + 1},
                             {"epoch", epoch},
                             {"d_loss", s.d_loss},
                             {"g_loss", s.g_loss},
                             {"d_accuracy", s.d_accuracy},
                             {"lr", lr}});
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
    if (c_.progress)
      progress.update(b + 1 - first, r.d_loss / static_cast<double>(b + 1 - first),
                      static_cast<double>((b + 1 - first) * c_.batch_size) / elapsed);
    if (c_.save_every > 0 && (done + 1) % c_.save_every == 0) save(after(epoch, b + 1, done + 1));
  }
  if (c_.progress) progress.finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  r.images_per_second = static_cast<double>(r.steps * c_.batch_size) / r.seconds;
  for (double* mean : {&r.d_loss, &r.g_loss, &r.d_accuracy}) *mean /= static_cast<double>(r.steps);
  return r;
}

// The grid of the fixed noise batch and, with a classifier, the FID; both reported.
void GanRun::evaluate(GanEpochResult& r) {
  r.samples_path = gan_samples_path(c_, r.epoch);
  write_png_grid(r.samples_path, sampler_.generate(fixed_noise(kGridSamples, c_.seed ^ 0x6d1dULL)),
                 8);
  std::map<std::string, MetricsWriter::Field> fields = {{"epoch", r.epoch},
                                                        {"step", start_.step},
                                                        {"d_loss", r.d_loss},
                                                        {"g_loss", r.g_loss},
                                                        {"d_accuracy", r.d_accuracy},
                                                        {"seconds", r.seconds},
                                                        {"images_per_second", r.images_per_second},
                                                        {"samples", r.samples_path}};
  if (fid_) {
    const std::int64_t n = std::min(kFidSamples, test_.size());
    r.fid = frechet_distance(fid_reference_,
                             fid_->fit(sampler_.generate(fixed_noise(n, c_.seed ^ 0xf1dULL))));
    fields["fid"] = r.fid;
  }
  metrics_->write("epoch", fields);
}

void GanRun::save(const TrainingPosition& at) const {
  if (c_.checkpoint_path.empty()) return;
  const std::map<std::string, std::string> settings = {
      {"model", c_.model},
      {"batch_size", std::to_string(c_.batch_size)},
      {"optimizer", c_.optimizer},
      {"lr", fmt::format("{}", c_.lr)},
      {"lr_schedule", c_.lr_schedule},
      {"seed", std::to_string(c_.seed)},
      {"epochs", std::to_string(c_.epochs)}};
  save_checkpoint(c_.checkpoint_path, gan_->parameters(), steps_.optimizer_state(), at, settings,
                  gan_->buffers());
}

std::vector<GanEpochResult> GanRun::run(
    const std::function<void(const GanEpochResult&)>& on_epoch) {
  std::vector<GanEpochResult> results;
  for (std::int64_t epoch = start_.epoch; epoch <= c_.epochs; ++epoch) {
    batcher_.start_epoch(epoch);
    const std::int64_t first =
        epoch == start_.epoch ? start_.batch : 0;  // a resumed epoch starts mid-way
    std::int64_t end = batcher_.batches_per_epoch();
    if (c_.max_steps >= 0) end = std::min(end, first + c_.max_steps - start_.step);
    if (end <= first) break;
    GanEpochResult r = train_epoch(epoch, first, end);
    start_ = after(epoch, end, start_.step + r.steps);
    save(start_);
    evaluate(r);
    results.push_back(r);
    if (on_epoch) on_epoch(r);
  }
  return results;
}

}  // namespace

std::vector<GanEpochResult> train_gan(
    const TrainConfig& c, const std::function<void(const GanEpochResult&)>& on_epoch,
    const std::function<void(const std::vector<VariablePtr>&)>& on_finish) {
  KILN_CHECK(model_info(c.model).task == ModelTask::gan, "train_gan: model '{}' is not a GAN",
             c.model);
  KILN_CHECK(c.epochs >= 1, "epochs must be at least 1 (got {})", c.epochs);
  KILN_CHECK(c.batch_size >= 1, "batch size must be at least 1 (got {})", c.batch_size);
  KILN_CHECK(std::isfinite(c.lr) && c.lr > 0, "learning rate must be positive (got {})", c.lr);
  if (!c.checkpoint_path.empty())  // fail now, not after an epoch of work
    check_checkpoint_directory(c.checkpoint_path);
  check_writable_directory(std::filesystem::absolute(c.samples_dir),
                           "--samples-dir " + c.samples_dir);
  GanRun run(c);
  std::vector<GanEpochResult> results = run.run(on_epoch);
  if (on_finish) on_finish(run.variables());
  return results;
}

}  // namespace kiln
