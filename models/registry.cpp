// Model names to builders.
#include "models/registry.h"

#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "models/alexnet.h"
#include "models/inception.h"
#include "models/lenet.h"
#include "models/resnet.h"
#include "models/vgg.h"
#include "models/row_lstm.h"
#include "models/char_lstm.h"

namespace kiln {

namespace {

std::vector<ModelInfo> zoo_infos() {
  return {
      {"lenet", "LeNet-style CNN (2 conv, 2 linear) for 28x28 images", ModelTask::image_classifier,
       Shape{1, 28, 28}, 10},
      {"resnet",
       "ResNet-14 (3 stages of 2 basic blocks, batch norm, global average pooling, dropout)",
       ModelTask::image_classifier, Shape{1, 28, 28}, 10, true, 4},
      {"resnet18",
       "ResNet-18, CIFAR form (3x3 stem, 4 stages of 2 basic blocks at 64-512 channels, batch "
       "norm, global average pooling) for 3x32x32 images",
       ModelTask::image_classifier, Shape{3, 32, 32}, 10, true, 8},
      {"vgg", "VGG-style stacks of 3x3 conv + batch norm and 2x2 max pooling, dropout",
       ModelTask::image_classifier, Shape{1, 28, 28}, 10},
      {"alexnet", "AlexNet-style CNN (5x5 stride-2 first conv, overlapping pools, dropout)",
       ModelTask::image_classifier, Shape{1, 28, 28}, 10},
      {"inception", "small GoogLeNet: Inception modules (1x1, 3x3, 5x5, pool branches), batch norm",
       ModelTask::image_classifier, Shape{1, 28, 28}, 10, true, 4},
      {"gan", "MLP GAN (G 100-256-784, D 784-256-1) for 28x28 images", ModelTask::gan,
       Shape{1, 28, 28}, 0},
      {"dcgan", "DCGAN (transposed convolutions, batch norm) for 28x28 images", ModelTask::gan,
       Shape{1, 28, 28}, 0},
      {"row-lstm",
       "bidirectional LSTM (128 per direction) over the 28 rows of an image, last states to a "
       "linear head",
       ModelTask::image_classifier, Shape{1, 28, 28}, 10},
      {"char-lstm",
       "character-level language model: embedding, LSTM or tanh RNN layers, linear head (96 "
       "characters)",
       ModelTask::language_model, Shape{}, kCharLstmVocabulary},
  };
}

// The zoo's models and the registered ones, with the builders of the registered.
struct Registry {
  std::mutex mutex;
  std::vector<ModelInfo> infos = zoo_infos();
  std::map<std::string, ClassifierBuilder> builders;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

const std::vector<ModelInfo>& model_infos() { return registry().infos; }

void register_classifier(ModelInfo info, ClassifierBuilder build) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  KILN_CHECK(!info.name.empty() && info.name.find_first_of(" \t\n") == std::string::npos,
             "register_classifier: the name '{}' must be one word", info.name);
  for (const ModelInfo& m : r.infos)
    KILN_CHECK(m.name != info.name, "register_classifier: a model named '{}' is known already",
               info.name);
  KILN_CHECK(info.task == ModelTask::image_classifier,
             "register_classifier: '{}' must be an image classifier", info.name);
  KILN_CHECK(info.input_shape.rank() == 3 && info.input_shape.numel() > 0 && info.classes >= 2,
             "register_classifier: '{}' takes {} images in {} classes; [C, H, W] images in at "
             "least 2 classes are needed",
             info.name, info.input_shape.str(), info.classes);
  KILN_CHECK(build != nullptr, "register_classifier: '{}' has no builder", info.name);
  r.builders.emplace(info.name, std::move(build));
  r.infos.push_back(std::move(info));
}

const ModelInfo& model_info(const std::string& name) {
  std::vector<std::string> names;
  for (const ModelInfo& m : model_infos()) {
    if (m.name == name) return m;
    names.push_back(m.name);
  }
  const std::string shown = name.size() > 60 ? name.substr(0, 60) + "..." : name;  // user text
  throw Error(fmt::format("unknown model '{}' (known: {})", shown, fmt::join(names, ", ")));
}

void check_model_input(const ModelInfo& info, const Shape& example, std::int64_t classes) {
  KILN_CHECK(info.task == ModelTask::image_classifier, "model '{}' is not an image classifier",
             info.name);
  if (example == info.input_shape && classes == info.classes) return;
  const std::string given = fmt::format("{} in {} classes", example.str(), classes);
  KILN_CHECK(info.any_input,
             "model {} takes only {} images in {} classes (its layers are sized for them), not "
             "{}: train resnet, resnet18 or inception, which take any size",
             info.name, info.input_shape.str(), info.classes, given);
  KILN_CHECK(example.rank() == 3 && example[1] >= info.min_input_size &&
                 example[2] >= info.min_input_size && classes >= 2,
             "model {} takes [C, H, W] images with H, W >= {} in at least 2 classes, not {}",
             info.name, info.min_input_size, given);
}

std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng) {
  const ModelInfo& info = model_info(name);
  return make_model(name, rng, info.input_shape, info.classes);
}

std::unique_ptr<nn::Layer> make_model(const std::string& name, Philox& rng, const Shape& example,
                                      std::int64_t classes) {
  check_model_input(model_info(name), example, classes);
  const std::int64_t channels = example[0];
  if (name == "lenet") return std::make_unique<LeNet>(rng);
  if (name == "resnet") return std::make_unique<ResNet>(rng, channels, classes);
  if (name == "resnet18") return std::make_unique<ResNet18>(rng, channels, classes);
  if (name == "vgg") return std::make_unique<Vgg>(rng);
  if (name == "alexnet") return std::make_unique<AlexNet>(rng);
  if (name == "inception") return std::make_unique<Inception>(rng, channels, classes);
  if (name == "row-lstm") return std::make_unique<RowLstm>(rng);
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.builders.find(name);
  KILN_ASSERT(it != r.builders.end(), "model {} is listed but has no builder", name);
  std::unique_ptr<nn::Layer> model = it->second(rng, example, classes);
  KILN_CHECK(model != nullptr, "model {}: its builder returned no model", name);
  return model;
}

}  // namespace kiln
