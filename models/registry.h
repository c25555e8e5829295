// The models `trainer --model NAME` can build, with the input each one expects.
#pragma once

#include <functional>
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
  Shape input_shape;  // image classifiers: one example, e.g. [1, 28, 28] (the default)
  std::int64_t classes = 0;
  // Image classifiers that end in global average pooling take any channels, any size of at
  // least min_input_size and any number of classes; the others only input_shape and classes.
  bool any_input = false;
  std::int64_t min_input_size = 0;
};

// The zoo's models, then those registered with register_classifier.
const std::vector<ModelInfo>& model_infos();
const ModelInfo& model_info(const std::string& name);  // kiln::Error listing the known names
// Image classifiers only; kiln::Error for a model of another task. Built for its
// input_shape and classes, or for `example` ([C, H, W]) and `classes`: kiln::Error naming
// what the model accepts when it cannot take them.
std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng);
std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng, const Shape& example,
                                      std::int64_t classes);
// The check make_model makes, alone.
void check_model_input(const ModelInfo& info, const Shape& example, std::int64_t classes);

// Builds a registered classifier for one example's shape [C, H, W] and a number of classes
// (those of its ModelInfo unless it takes any_input).
using ClassifierBuilder = std::function<std::unique_ptr<nn::Layer>(
    Philox& rng, const Shape& example, std::int64_t classes)>;
// Adds an image classifier of your own to the models the one training loop (train/loop.h) and
// the command lines of trainer, dump and bench (tools/tool_main.h) know by name, so that it
// trains with every flag the zoo's do (data, checkpoints and resume, schedules, metrics, data
// parallelism, gradient accumulation, eval and predict) and dump and bench show and time it.
// Register before training starts (at the top of main: ranks and the OpenMP set-up run the
// program again). kiln::Error for a name already
// known, a task other than image_classifier, an input_shape that is not [C, H, W] or fewer
// than 2 classes.
void register_classifier(ModelInfo info, ClassifierBuilder build);

}  // namespace kiln
