// ClassifierTask: data, model, optimizer, the compiled train step and the evaluator.
#include "train/classifier_task.h"

#include <fmt/format.h>

#include "data/batch_loader.h"
#include "train/evaluate.h"
#include "train/tasks.h"

namespace kiln {
namespace {

// --crop-padding and --flip, the border black after normalisation.
Augmentation augmentation_of(const TrainConfig& c, const ImageData& data) {
  Augmentation a{.crop_padding = c.images.crop_padding, .flip = c.images.flip};
  for (std::size_t k = 0; k < data.stats.mean.size(); ++k)
    a.fill.push_back((0.0f - data.stats.mean[k]) / data.stats.std[k]);
  return a;
}

class ClassifierTask : public Task {
 public:
  ClassifierTask(const TrainConfig& c, const TaskContext& context)
      : batch_(c.loop.batch_size),
        world_size_(context.world_size),
        data_(classifier_images(c)),
        batcher_(data_.train, c.loop.batch_size, true, c.loop.seed, context.rank,
                 context.world_size, augmentation_of(c, data_)),
        loader_(batcher_, batch_shape(c.loop.batch_size, data_.example),
                {.threads = c.images.loader_threads, .depth = c.images.loader_depth}),
        graph_(build_model_graph(
            c.model, Stage::train, c.loop.batch_size, optimizer_config(c.loop), c.loop.seed,
            {.clip_grad_norm = c.loop.clip_grad_norm,
             .data_parallel_group = context.collective_group,
             .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
             .sync_batch_norm = c.parallel.sync_batch_norm,
             .label_smoothing = c.images.label_smoothing,
             .loss_scale = loss_scale_of(c.device),
             .accumulate = static_cast<int>(c.loop.accumulate)},
            {data_.example, static_cast<std::int64_t>(data_.classes.size())})),
        step_(compile(*graph_.graph, context.options)),
        evaluator_(*graph_.model, data_.example, c.images.eval_batch, context.options) {}

  std::int64_t steps_per_epoch() const override { return batcher_.batches_per_epoch(); }
  std::int64_t examples_per_step() const override { return batch_ * world_size_; }
  std::vector<StepProgram> programs() override { return {{"step", step_.get()}}; }
  void start_epoch(std::int64_t epoch) override { loader_.start_epoch(epoch); }

  // The loader's batch: filled ahead by its threads while the previous steps ran.
  std::vector<std::vector<Feed>> feeds(std::int64_t batch, std::int64_t) override {
    BatchLoader::Batch b = loader_.take(batch);
    return {{{"x", b.images}, {"y", b.labels}}};
  }

  StepValues step_values(const std::vector<Outputs>& outputs) override {
    return {.loss = outputs[0].at("loss").item()};
  }
  void set_lr(double lr) override { graph_.optimizer->set_lr(lr); }

  Values evaluate(std::int64_t, std::vector<std::pair<std::string, std::string>>&) override {
    const EvalResult r = evaluator_.evaluate(data_.test);
    return {{"test_accuracy", r.accuracy}, {"test_loss", r.loss}};
  }

  TaskState state() const override {
    return {graph_.model->parameters(), graph_.optimizer->state(), graph_.model->buffers()};
  }
  std::map<std::string, std::string> metadata() const override { return image_metadata(data_); }

 private:
  std::int64_t batch_;
  int world_size_;
  ImageData data_;
  Batcher batcher_;
  BatchLoader loader_;
  ModelGraph graph_;
  std::unique_ptr<Program> step_;
  Evaluator evaluator_;
};

std::string summary(const TrainConfig&, const EpochReport& r) {
  return fmt::format(
      "epoch {}: train loss {:.4f}, test loss {:.4f}, test accuracy {:.2f}%, {:.0f} images/s, "
      "{:.1f} s",
      r.epoch, r.loss, r.value("test_loss"), 100.0 * r.value("test_accuracy"),
      r.examples_per_second, r.seconds);
}

// dump and bench: the model's own input, or --data synthetic:CxHxW's.
ModelInput tool_input(const TrainConfig& c) {
  const DataSource s = parse_data_source(c.images.data);
  if (s.kind != "synthetic" || s.synthetic_shape.empty()) return {};
  return {Shape(s.synthetic_shape), model_info(c.model).classes};
}

RecordedStep record(const TrainConfig& c, const std::string& stage) {
  ModelGraph m = build_model_graph(c.model, stage == "train" ? Stage::train : Stage::forward,
                                   c.loop.batch_size, optimizer_config(c.loop), c.loop.seed,
                                   {.clip_grad_norm = c.loop.clip_grad_norm,
                                    .label_smoothing = c.images.label_smoothing,
                                    .loss_scale = loss_scale_of(c.device)},
                                   tool_input(c));
  auto owner = std::make_shared<ModelGraph>(std::move(m));
  std::unique_ptr<Graph> graph = std::move(owner->graph);
  return {owner, std::move(graph)};
}

// bench: SGD with momentum on random images.
BenchStep bench_step(const TrainConfig& c, const TaskContext& context) {
  const ModelInfo& info = model_info(c.model);
  const std::int64_t batch = c.loop.batch_size;
  const ModelInput input = tool_input(c);
  ModelGraph m = build_model_graph(
      c.model, Stage::train, batch, {.name = "sgd", .lr = 0.01, .momentum = 0.9}, 0,
      {.data_parallel_group = context.collective_group,
       .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
       .sync_batch_norm = c.parallel.sync_batch_norm},
      input);
  const Shape example = input.example.rank() == 0 ? info.input_shape : input.example;
  const Dataset data =
      synthetic_images(batch, example, info.classes, 1 + static_cast<std::uint64_t>(context.rank));
  auto owner = std::make_shared<ModelGraph>(std::move(m));
  std::unique_ptr<Graph> graph = std::move(owner->graph);
  return {.label = fmt::format("{} training step, batch {}{}, SGD momentum", c.model, batch,
                               input.example.rank() == 0 ? "" : ", input " + example.str()),
          .items = batch,
          .recorded = {owner, std::move(graph)},
          .feeds = {{"x", data.images}, {"y", data.labels}}};
}

}  // namespace

TaskEntry classifier_task() {
  return {.kind = ModelTask::image_classifier,
          .name = "image classifier",
          .make = [](const TrainConfig& c, const TaskContext& context) -> std::unique_ptr<Task> {
            return std::make_unique<ClassifierTask>(c, context);
          },
          .apply_defaults = nullptr,
          .summary = summary,
          .stages = {"train", "forward"},
          .record = record,
          .bench = bench_step};
}

}  // namespace kiln
