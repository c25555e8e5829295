// ClassifierTask: data, model, optimizer, the compiled train step and the evaluator.
#include "train/classifier_task.h"

#include <fmt/format.h>

#include "train/evaluate.h"
#include "train/tasks.h"

namespace kiln {
namespace {

class ClassifierTask : public Task {
 public:
  ClassifierTask(const TrainConfig& c, const TaskContext& context)
      : info_(model_info(c.model)),
        batch_(c.loop.batch_size),
        world_size_(context.world_size),
        train_(classifier_data(c, info_, Split::train)),
        test_(classifier_data(c, info_, Split::test)),
        batcher_(train_, c.loop.batch_size, true, c.loop.seed, context.rank, context.world_size),
        graph_(build_model_graph(
            c.model, Stage::train, c.loop.batch_size, optimizer_config(c.loop), c.loop.seed,
            {.clip_grad_norm = c.loop.clip_grad_norm,
             .data_parallel_group = context.collective_group,
             .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024,
             .loss_scale = loss_scale_of(c.device)})),
        step_(compile(*graph_.graph, context.options)),
        evaluator_(*graph_.model, info_.input_shape, c.images.eval_batch, context.options) {}

  std::int64_t steps_per_epoch() const override { return batcher_.batches_per_epoch(); }
  std::int64_t examples_per_step() const override { return batch_ * world_size_; }
  std::vector<StepProgram> programs() override { return {{"step", step_.get()}}; }
  void start_epoch(std::int64_t epoch) override { batcher_.start_epoch(epoch); }

  std::vector<std::vector<Feed>> feeds(std::int64_t batch, std::int64_t) override {
    Tensor images = Tensor::empty(batch_shape(batch_, info_.input_shape), DType::f32);
    Tensor labels = Tensor::empty({batch_}, DType::i64);
    batcher_.fill(batch, images, labels);
    return {{{"x", images}, {"y", labels}}};
  }

  StepValues step_values(const std::vector<Outputs>& outputs) override {
    return {.loss = outputs[0].at("loss").item()};
  }
  void set_lr(double lr) override { graph_.optimizer->set_lr(lr); }

  Values evaluate(std::int64_t, std::vector<std::pair<std::string, std::string>>&) override {
    const EvalResult r = evaluator_.evaluate(test_);
    return {{"test_accuracy", r.accuracy}, {"test_loss", r.loss}};
  }

  TaskState state() const override {
    return {graph_.model->parameters(), graph_.optimizer->state(), graph_.model->buffers()};
  }

 private:
  const ModelInfo& info_;
  std::int64_t batch_;
  int world_size_;
  Dataset train_, test_;
  Batcher batcher_;
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

RecordedStep record(const TrainConfig& c, const std::string& stage) {
  ModelGraph m = build_model_graph(
      c.model, stage == "train" ? Stage::train : Stage::forward, c.loop.batch_size,
      optimizer_config(c.loop), c.loop.seed,
      {.clip_grad_norm = c.loop.clip_grad_norm, .loss_scale = loss_scale_of(c.device)});
  auto owner = std::make_shared<ModelGraph>(std::move(m));
  std::unique_ptr<Graph> graph = std::move(owner->graph);
  return {owner, std::move(graph)};
}

// bench: SGD with momentum on random images.
BenchStep bench_step(const TrainConfig& c, const TaskContext& context) {
  const ModelInfo& info = model_info(c.model);
  const std::int64_t batch = c.loop.batch_size;
  ModelGraph m = build_model_graph(
      c.model, Stage::train, batch, {.name = "sgd", .lr = 0.01, .momentum = 0.9}, 0,
      {.data_parallel_group = context.collective_group,
       .bucket_bytes = static_cast<std::size_t>(c.parallel.bucket_kib) * 1024});
  const Dataset data = synthetic_images(batch, info.input_shape, info.classes,
                                        1 + static_cast<std::uint64_t>(context.rank));
  auto owner = std::make_shared<ModelGraph>(std::move(m));
  std::unique_ptr<Graph> graph = std::move(owner->graph);
  return {.label = fmt::format("{} training step, batch {}, SGD momentum", c.model, batch),
          .items = batch,
          .recorded = {owner, std::move(graph)},
          .feeds = {{"x", data.images}, {"y", data.labels}}};
}

}  // namespace

Dataset classifier_data(const TrainConfig& c, const ModelInfo& info, Split split) {
  const std::uint64_t seed = c.loop.seed;
  if (c.images.synthetic)
    return split == Split::train ? synthetic_images(4096, info.input_shape, info.classes, seed)
                                 : synthetic_images(1000, info.input_shape, info.classes, seed + 1);
  Dataset data =
      load_fashion_mnist(c.images.data_dir.empty() ? kFashionMnistDir : c.images.data_dir, split);
  const std::vector<std::int64_t>& dims = data.images.shape().dims();
  const Shape example(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
  KILN_CHECK(example == info.input_shape,
             "model {} takes {} images but Fashion-MNIST's are {}: train it with --synthetic "
             "(a CIFAR data source is still to come)",
             info.name, info.input_shape.str(), example.str());
  return data;
}

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
