// The models `trainer --model NAME` can build, with the input each one expects.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/nn/module.h"

namespace kiln {

// What a model is trained for; the one training loop runs each through its task
// (train/tasks.h).
enum class ModelTask {
  image_classifier,  // Fashion-MNIST images -> 10 classes; make_model builds it
  language_model,    // next character of a text (train/lm_task.h)
  gan,               // generator and discriminator (train/gan_task.h)
};

struct ModelInfo {
  std::string name;
  std::string description;
  ModelTask task = ModelTask::image_classifier;
  Shape input_shape;  // image classifiers: one example, e.g. [1, 28, 28]
  std::int64_t classes = 0;
};

const std::vector<ModelInfo>& model_infos();
const ModelInfo& model_info(const std::string& name);  // kiln::Error listing the known names
// Image classifiers only; kiln::Error for a model of another task.
std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng);

}  // namespace kiln
