// The models `trainer --model NAME` can build, with the input each one expects.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "graph/nn/module.h"

namespace kiln {

struct ModelInfo {
  std::string name;
  std::string description;
  Shape input_shape;  // one example, e.g. [1, 28, 28]
  std::int64_t classes;
};

const std::vector<ModelInfo>& model_infos();
const ModelInfo& model_info(const std::string& name);  // kiln::Error listing the known names
std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng);

}  // namespace kiln
