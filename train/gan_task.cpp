// GanTask: data in [-1, 1], the GAN and its two steps, grids of samples and the FID.
#include "train/gan_task.h"

#include <filesystem>

#include "core/atomic_file.h"
#include "data/dataset.h"
#include "train/fid.h"
#include "train/gan_steps.h"
#include "train/png_grid.h"
#include "train/tasks.h"

namespace kiln {
namespace {

constexpr std::int64_t kSampleBatch = 500;  // generator batch for grids and FID samples

// Uniform images in [-1, 1] (tests, benchmarks).
Dataset synthetic_gan_images(std::int64_t n, std::uint64_t seed) {
  Dataset d = synthetic_images(n, {1, 28, 28}, 10, seed);
  Philox(seed).fill_uniform(d.images, -1.0, 1.0);
  return d;
}

Dataset load_split(const TrainConfig& c, Split split) {
  const bool train = split == Split::train;
  if (c.images.synthetic) return synthetic_gan_images(train ? 4096 : 1000, c.loop.seed + !train);
  return load_fashion_mnist(c.images.data_dir.empty() ? kFashionMnistDir : c.images.data_dir, split,
                            PixelScale::symmetric);
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

OptimizerConfig gan_optimizer(const TrainConfig& c) {
  OptimizerConfig o = optimizer_config(c.loop);
  o.beta1 = kGanBeta1;
  return o;
}

std::unique_ptr<Gan> build_gan(const TrainConfig& c) {
  Philox rng(c.loop.seed);
  return make_gan(c.model, rng);
}

class GanTask : public Task {
 public:
  GanTask(const TrainConfig& c, const TaskContext& context);

  std::int64_t steps_per_epoch() const override { return batcher_.batches_per_epoch(); }
  std::int64_t examples_per_step() const override { return batch_ * context_.world_size; }
  std::vector<StepProgram> programs() override {
    return {{"discriminator step", &steps_.discriminator_step()},
            {"generator step", &steps_.generator_step()}};
  }
  void start_epoch(std::int64_t epoch) override { batcher_.start_epoch(epoch); }
  std::vector<std::vector<Feed>> feeds(std::int64_t batch, std::int64_t step) override;
  StepValues step_values(const std::vector<Outputs>& outputs) override;
  void set_lr(double lr) override { steps_.set_lr(lr); }
  Values evaluate(std::int64_t epoch,
                  std::vector<std::pair<std::string, std::string>>& files) override;
  TaskState state() const override {
    return {gan_->parameters(), steps_.optimizer_state(), gan_->buffers()};
  }

 private:
  const TrainConfig& c_;
  TaskContext context_;
  std::int64_t batch_;
  Dataset train_, test_;
  std::unique_ptr<Gan> gan_;
  GanSteps steps_;
  Sampler sampler_;
  Batcher batcher_;
  std::unique_ptr<FidScorer> fid_;
  GaussianFit fid_reference_;
  NoiseAhead noise_;  // the global batch's noise; this rank feeds its rows
};

GanTask::GanTask(const TrainConfig& c, const TaskContext& context)
    : c_(c),
      context_(context),
      batch_(c.loop.batch_size),
      train_(load_split(c, Split::train)),
      test_(load_split(c, Split::test)),
      gan_(build_gan(c)),
      steps_(*gan_, batch_, gan_optimizer(c), context.options,
             {.data_parallel_group = context.collective_group,
              .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
              .sync_batch_norm = c.parallel.sync_batch_norm,
              .loss_scale = loss_scale_of(c.device)}),
      sampler_(*gan_, context.options),
      batcher_(train_, batch_, true, c.loop.seed, context.rank, context.world_size),
      noise_(batch_ * context.world_size, c.loop.seed, !context.options.device.is_cpu()) {
  if (c.gan.fid_classifier.empty()) return;
  // The reference statistics first: a bad classifier fails before training.
  fid_ = std::make_unique<FidScorer>(c.gan.fid_classifier, context.options);
  fid_reference_ = fid_->fit(test_.images.narrow_rows(0, std::min(kFidSamples, test_.size())));
}

std::vector<std::vector<Feed>> GanTask::feeds(std::int64_t batch, std::int64_t step) {
  Tensor real = Tensor::empty({batch_, 1, 28, 28}, DType::f32);
  Tensor labels = Tensor::empty({batch_}, DType::i64);
  batcher_.fill(batch, real, labels);
  Tensor z = noise_.take(static_cast<std::uint64_t>(step));
  if (context_.world_size > 1) z = z.narrow_rows(context_.rank * batch_, batch_).clone();
  return {{{"real", real}, {"z", z}}, {{"z", z}}};
}

StepValues GanTask::step_values(const std::vector<Outputs>& outputs) {
  double accuracy = discriminator_accuracy(outputs[0]);
  context_.average(std::span(&accuracy, 1));  // of the global batch
  const double d_loss = outputs[0].at("loss").item(), g_loss = outputs[1].at("loss").item();
  return {.loss = d_loss,
          .extras = {{"d_loss", d_loss}, {"g_loss", g_loss}, {"d_accuracy", accuracy}}};
}

// The grid of the fixed noise batch and, with a classifier, the FID.
Values GanTask::evaluate(std::int64_t epoch,
                         std::vector<std::pair<std::string, std::string>>& files) {
  const std::string grid = gan_samples_path(c_, epoch);
  write_png_grid(grid, sampler_.generate(fixed_noise(kGridSamples, c_.loop.seed ^ 0x6d1dULL)), 8);
  files.emplace_back("samples", grid);
  if (!fid_) return {};
  const std::int64_t n = std::min(kFidSamples, test_.size());
  const Tensor samples = sampler_.generate(fixed_noise(n, c_.loop.seed ^ 0xf1dULL));
  return {{"fid", frechet_distance(fid_reference_, fid_->fit(samples))}};
}

std::string summary(const TrainConfig&, const EpochReport& r) {
  const std::string fid = r.has("fid") ? fmt::format(", FID {:.2f}", r.value("fid")) : "";
  std::string samples;
  for (const auto& [name, path] : r.files)
    if (name == "samples") samples = path;
  return fmt::format(
      "epoch {}: D loss {:.4f}, G loss {:.4f}, D accuracy {:.1f}%{}, {:.0f} images/s, {:.1f} s, "
      "samples {}",
      r.epoch, r.value("d_loss"), r.value("g_loss"), 100.0 * r.value("d_accuracy"), fid,
      r.examples_per_second, r.seconds, samples);
}

// Adam at 2e-4 with a constant rate, where neither a flag nor the config file set them.
void apply_defaults(TrainConfig& c, const std::set<std::string>& given) {
  if (!given.count("lr")) c.loop.lr = kGanLr;
  if (!given.count("lr-schedule")) c.loop.lr_schedule = "constant";
}

RecordedStep record(const TrainConfig& c, const std::string& stage) {
  struct Owner {
    std::unique_ptr<Gan> gan;
    std::unique_ptr<Optimizer> optimizer;
  };
  auto owner = std::make_shared<Owner>(Owner{build_gan(c), make_optimizer(gan_optimizer(c))});
  auto graph = std::make_unique<Graph>();
  const std::int64_t batch = c.loop.batch_size;
  if (stage == "discriminator")
    record_discriminator_step(*graph, *owner->gan, batch, *owner->optimizer);
  else
    record_generator_step(*graph, *owner->gan, batch, *owner->optimizer);
  return {owner, std::move(graph)};
}

}  // namespace

std::string gan_samples_path(const TrainConfig& c, std::int64_t epoch) {
  return (std::filesystem::path(c.gan.samples_dir) / fmt::format("{}-epoch-{}.png", c.model, epoch))
      .string();
}

TaskEntry gan_task() {
  return {.kind = ModelTask::gan,
          .name = "GAN",
          .make = [](const TrainConfig& c, const TaskContext& context) -> std::unique_ptr<Task> {
            check_writable_directory(std::filesystem::absolute(c.gan.samples_dir),
                                     "--samples-dir " + c.gan.samples_dir);
            return std::make_unique<GanTask>(c, context);
          },
          .apply_defaults = apply_defaults,
          .summary = summary,
          .stages = {"discriminator", "generator"},
          .record = record,
          .bench = gan_bench_step};
}

}  // namespace kiln
