// The graphs the tools and the training loop compile: a model's forward pass, or its whole
// training step (forward, backward, optimizer update), at a batch size.
#pragma once

#include <memory>
#include <string>

#include "graph/nn/module.h"
#include "graph/optim.h"
#include "graph/train_step.h"

namespace kiln {

struct OptimizerConfig {
  std::string name = "adam";  // sgd, adam, adamw
  double lr = 1e-3;
  double momentum = 0.9;  // sgd
  double weight_decay = 0.0;
  double beta1 = 0.9;  // adam, adamw (GANs use 0.5)
};
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config);

enum class Stage { forward, train };

struct ModelGraph {
  std::unique_ptr<nn::Layer> model;
  std::unique_ptr<Optimizer> optimizer;  // train stage only
  std::unique_ptr<Graph> graph;          // inputs "x" (and "y"); output "logits" or "loss"
};

// What an image classifier is built for: one example's shape [C, H, W] and the classes;
// an empty example: the model's own (models/registry.h's input_shape and classes).
struct ModelInput {
  Shape example;
  std::int64_t classes = 0;
};

// Builds model `name` (initialised from `seed`) for `input` and records its graph for
// `stage`; the train stage clips gradients as `step` says.
ModelGraph build_model_graph(const std::string& name, Stage stage, std::int64_t batch,
                             const OptimizerConfig& optimizer, std::uint64_t seed = 0,
                             const TrainStepOptions& step = {}, const ModelInput& input = {});

// [batch, example...]
Shape batch_shape(std::int64_t batch, const Shape& example);

}  // namespace kiln
