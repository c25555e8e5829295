// The data of an image classifier's run: the --data source or synthetic images, checked
// against what the model accepts, and what its checkpoint records about them.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "train/classifier_task.h"

namespace kiln {
namespace {

ImageData synthetic_data(const TrainConfig& c, const ModelInfo& info, const Shape& example) {
  const std::uint64_t seed = c.loop.seed;
  ImageData d{.train = synthetic_images(4096, example, info.classes, seed),
              .test = synthetic_images(1000, example, info.classes, seed + 1)};
  // The zoo's ten classes keep Fashion-MNIST's names, as predict printed them before.
  for (std::int64_t k = 0; k < info.classes; ++k)
    d.classes.push_back(info.classes == 10 ? fashion_mnist_class_name(k) : std::to_string(k));
  d.stats = {std::vector<float>(static_cast<std::size_t>(example[0]), 0.0f),
             std::vector<float>(static_cast<std::size_t>(example[0]), 1.0f)};
  d.example = example;
  return d;
}

}  // namespace

ImageDataOptions image_data_options(const TrainConfig& c) {
  const ImageSettings& s = c.images;
  ImageDataOptions o{
      .source = parse_data_source(s.data),
      .folder = {.image_size = s.image_size, .test_fraction = s.test_fraction, .seed = c.loop.seed},
      .pad = s.pad};
  if (o.source.kind == "fashion-mnist" && o.source.dir.empty()) o.source.dir = s.data_dir;
  if (!s.mean.empty()) o.mean = parse_channel_values(s.mean, "--mean");
  if (!s.std.empty()) o.std = parse_channel_values(s.std, "--std");
  return o;
}

ImageData classifier_images(const TrainConfig& c) {
  const ModelInfo& info = model_info(c.model);
  const ImageDataOptions options = image_data_options(c);
  if (c.images.synthetic || options.source.kind == "synthetic") {
    const std::vector<std::int64_t>& shape = options.source.synthetic_shape;
    const Shape example = shape.empty() ? info.input_shape : Shape(shape);
    check_model_input(info, example, info.classes);
    return synthetic_data(c, info, example);
  }
  ImageData d = load_image_data(options);
  try {
    check_model_input(info, d.example, static_cast<std::int64_t>(d.classes.size()));
  } catch (const Error& e) {
    throw Error(fmt::format("--data {}: {}", c.images.data, e.what()));
  }
  return d;
}

Dataset classifier_data(const TrainConfig& c, const ModelInfo&, Split split) {
  ImageData d = classifier_images(c);
  return split == Split::train ? d.train : d.test;
}

std::map<std::string, std::string> image_metadata(const ImageData& d) {
  return {{"kiln.classes", nlohmann::json(d.classes).dump()},
          {"kiln.input_shape", fmt::format("{}", fmt::join(d.example.dims(), "x"))},
          {"kiln.mean", fmt::format("{}", fmt::join(d.stats.mean, ","))},
          {"kiln.std", fmt::format("{}", fmt::join(d.stats.std, ","))}};
}

}  // namespace kiln
