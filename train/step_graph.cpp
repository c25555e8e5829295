// Model + optimizer + recorded graph, for a stage.
#include "train/step_graph.h"

#include "graph/nn/batch_norm.h"
#include "graph/nn/dropout.h"
#include "graph/nn/functional.h"
#include "graph/train_step.h"
#include "models/registry.h"

namespace kiln {

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& c) {
  if (c.name == "sgd")
    return std::make_unique<Sgd>(
        SgdOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});
  if (c.name == "adam" || c.name == "adamw")
    return std::make_unique<Adam>(AdamOptions{.lr = c.lr,
                                              .beta1 = c.beta1,
                                              .weight_decay = c.weight_decay,
                                              .decoupled_weight_decay = c.name == "adamw"});
  throw Error(fmt::format("unknown optimizer '{}' (sgd, adam, adamw)", c.name));
}

Shape batch_shape(std::int64_t batch, const Shape& example) {
  std::vector<std::int64_t> dims = {batch};
  dims.insert(dims.end(), example.dims().begin(), example.dims().end());
  return Shape(dims);
}

ModelGraph build_model_graph(const std::string& name, Stage stage, std::int64_t batch,
                             const OptimizerConfig& optimizer, std::uint64_t seed,
                             const TrainStepOptions& step, const ModelInput& input) {
  KILN_CHECK(batch >= 1, "batch size must be at least 1 (got {})", batch);
  const ModelInfo& info = model_info(name);
  const bool own = input.example.rank() == 0;
  const Shape example = own ? info.input_shape : input.example;
  Philox rng(seed);
  ModelGraph m{make_model(name, rng, example, own ? info.classes : input.classes), nullptr,
               std::make_unique<Graph>()};
  Graph& g = *m.graph;
  if (stage == Stage::train && step.data_parallel_group >= 0) {
    nn::shard_dropout(*m.model, step.data_parallel_group);  // one process's masks, whatever N
    if (step.sync_batch_norm) nn::sync_batch_norm(*m.model, step.data_parallel_group);
  }
  const Value logits = (*m.model)(g.input("x", batch_shape(batch, example)));
  if (stage == Stage::forward) {
    g.output("logits", logits);
    return m;
  }
  m.optimizer = make_optimizer(optimizer);
  append_training_step(
      cross_entropy(logits, g.input("y", {batch}, DType::i64), step.label_smoothing),
      m.model->parameters(), *m.optimizer, step);
  return m;
}

}  // namespace kiln
