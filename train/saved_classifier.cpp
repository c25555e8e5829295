// Training settings in checkpoint metadata, resume checks, loading trained classifiers.
#include "train/saved_classifier.h"

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "data/image_data.h"
#include "train/config_file.h"
#include "train/flags.h"

namespace kiln {
namespace {

// kiln.world_size: the ranks of the run that wrote the checkpoint (1 when it says nothing).
std::int64_t saved_world_size(const Checkpoint& checkpoint) {
  const std::string text = checkpoint.metadata_value("kiln.world_size");
  if (text.empty()) return 1;
  std::size_t used = 0;
  std::int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used == text.size() && value >= 1 && value <= (1 << 16),
             "--resume {}: metadata 'kiln.world_size' is '{}', not a number of ranks (1 to 65536)",
             checkpoint.path().string(), excerpt(text));
  return value;
}

// The classifier's input, classes and normalisation from its metadata, each checked.
void read_image_metadata(const Checkpoint& checkpoint, const ModelInfo& info, SavedClassifier& s) {
  const std::string path = checkpoint.path().string();
  const std::string shape = checkpoint.metadata_value("kiln.input_shape");
  s.example = shape.empty()
                  ? info.input_shape
                  : Shape(parse_image_shape(shape, path + ": metadata 'kiln.input_shape'"));
  const std::string classes = checkpoint.metadata_value("kiln.classes");
  if (classes.empty()) {
    for (std::int64_t c = 0; c < info.classes; ++c)
      s.classes.push_back(info.classes == 10 ? fashion_mnist_class_name(c) : std::to_string(c));
  } else {
    const nlohmann::json names = nlohmann::json::parse(classes, nullptr, false, true);
    KILN_CHECK(names.is_array() && names.size() >= 2 && names.size() <= (1 << 20),
               "{}: metadata 'kiln.classes' is not a JSON array of class names", path);
    for (const nlohmann::json& n : names) {
      KILN_CHECK(n.is_string(), "{}: metadata 'kiln.classes' holds {}, not a name", path,
                 json_excerpt(n));
      s.classes.push_back(n.get<std::string>());
    }
  }
  const std::string mean = checkpoint.metadata_value("kiln.mean");
  const std::string std = checkpoint.metadata_value("kiln.std");
  const auto channels = static_cast<std::size_t>(s.example[0]);
  s.mean = mean.empty() ? std::vector<float>(channels, kFashionMnistMean)
                        : parse_channel_values(mean, path + ": metadata 'kiln.mean'");
  s.std = std.empty() ? std::vector<float>(channels, kFashionMnistStd)
                      : parse_channel_values(std, path + ": metadata 'kiln.std'");
  KILN_CHECK(
      s.mean.size() == s.std.size() && static_cast<std::int64_t>(s.mean.size()) == s.example[0],
      "{}: metadata 'kiln.mean' and 'kiln.std' need one value per channel of {}", path,
      s.example.str());
}

// The images' geometry and normalisation (--pad, --image-size, --mean, --std) are part of the
// model's input, so a resume keeps them; augmentation may change mid-run, and one line says so.
void check_resumed_images(const std::string& path, const ImageSettings& saved,
                          const ImageSettings& now) {
  KILN_CHECK(saved.pad == now.pad && saved.image_size == now.image_size,
             "--resume {}: the checkpoint was trained on images with --pad {} --image-size {} but "
             "this run has --pad {} --image-size {} (the model's input would change)",
             path, saved.pad, saved.image_size, now.pad, now.image_size);
  KILN_CHECK(saved.mean == now.mean && saved.std == now.std,
             "--resume {}: the checkpoint was trained with --mean '{}' --std '{}' but this run has "
             "--mean '{}' --std '{}' (empty: from the training set)",
             path, excerpt(saved.mean), excerpt(saved.std), excerpt(now.mean), excerpt(now.std));
  if (saved.crop_padding != now.crop_padding || saved.flip != now.flip)
    log().warn("--resume {}: augmentation changes from --crop-padding {}{} to --crop-padding {}{}",
               path, saved.crop_padding, saved.flip ? " --flip" : "", now.crop_padding,
               now.flip ? " --flip" : "");
}

}  // namespace

std::map<std::string, std::string> training_metadata(const TrainConfig& config) {
  return {{"model", config.model},
          {"kiln.config", train_config_json(config)},
          {"kiln.data_seed", std::to_string(config.loop.seed)},
          {"kiln.world_size", std::to_string(config.parallel.world_size)}};
}

TrainConfig checkpoint_config(const Checkpoint& checkpoint) {
  return checkpoint_settings(checkpoint.metadata(), checkpoint.path().string());
}

void check_resumable(const TrainConfig& c, const Checkpoint& checkpoint) {
  const std::string path = checkpoint.path().string();
  const std::string model = checkpoint.metadata_value("model");
  const bool has_config = !checkpoint.metadata_value("kiln.config").empty();
  if (has_config) checkpoint_config(checkpoint);  // its own metadata agrees with itself
  KILN_CHECK(model.empty() || model == c.model,
             "--resume {}: a checkpoint of model '{}', but this run trains '{}'", path,
             excerpt(model), c.model);
  if (model.empty() || (!has_config && checkpoint.metadata_value("batch_size").empty()))
    return;  // no settings to compare: the tensors are checked on restore
  const TrainConfig saved = checkpoint_config(checkpoint);
  // A run on N ranks trains on the global batch batch_size * N: a checkpoint resumes on any
  // number of ranks (or the CPU) whose global batch is the same.
  // So may one whose micro-batches (--accumulate) make up a step of the same examples.
  const std::int64_t saved_world = saved_world_size(checkpoint);
  const std::int64_t batch = c.loop.batch_size, world = c.parallel.world_size;
  const std::int64_t micro = c.loop.accumulate, saved_micro = saved.loop.accumulate;
  if (saved_world == 1 && world == 1 && saved_micro == micro)
    KILN_CHECK(saved.loop.batch_size == batch,
               "--resume {}: the checkpoint was written with batch size {} but this run has {} "
               "(its data position would not match)",
               path, saved.loop.batch_size, batch);
  KILN_CHECK(
      saved.loop.batch_size * saved_world * saved_micro == batch * world * micro,
      "--resume {}: the checkpoint was written with steps of {} examples (batch {} x {} ranks "
      "x --accumulate {}) but this run has {} (batch {} x {} ranks x --accumulate {}): its "
      "data position would not match",
      path, saved.loop.batch_size * saved_world * saved_micro, saved.loop.batch_size, saved_world,
      saved_micro, batch * world * micro, batch, world, micro);
  KILN_CHECK(!has_config || saved.images.synthetic == c.images.synthetic,
             "--resume {}: the checkpoint was trained on {} data but this run uses {}", path,
             saved.images.synthetic ? "synthetic" : "real",
             c.images.synthetic ? "synthetic" : "real");
  const std::string saved_kind = parse_data_source(saved.images.data).kind;
  const std::string kind = parse_data_source(c.images.data).kind;
  KILN_CHECK(!has_config || saved_kind == kind,
             "--resume {}: the checkpoint was trained on --data {} but this run uses --data {}",
             path, excerpt(saved.images.data), excerpt(c.images.data));
  if (has_config && precision_of(saved.device) != precision_of(c.device))
    log().warn(
        "--resume {}: trained in {} so far, continuing in {} (master weights and optimizer state "
        "are fp32 in both)",
        path, precision_name(precision_of(saved.device)), precision_name(precision_of(c.device)));
  if (has_config) check_resumed_images(path, saved.images, c.images);
  const std::string data_seed = checkpoint.metadata_value("kiln.data_seed");
  const std::string seed = data_seed.empty() ? checkpoint.metadata_value("seed") : data_seed;
  KILN_CHECK(
      seed.empty() || seed == std::to_string(c.loop.seed),
      "--resume {}: the checkpoint's data order comes from seed {} but this run has --seed {}",
      path, excerpt(seed), c.loop.seed);
}

SavedClassifier load_classifier(const std::filesystem::path& path) {
  const Checkpoint checkpoint(path);
  SavedClassifier saved{checkpoint_config(checkpoint), nullptr, checkpoint.position().step};
  const ModelInfo* info = nullptr;
  try {
    info = &model_info(saved.config.model);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
  KILN_CHECK(info->task == ModelTask::image_classifier,
             "{}: a checkpoint of '{}', which is not an image classifier", path.string(),
             saved.config.model);
  read_image_metadata(checkpoint, *info, saved);
  Philox rng(saved.config.loop.seed);
  try {
    saved.model = make_model(saved.config.model, rng, saved.example,
                             static_cast<std::int64_t>(saved.classes.size()));
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path.string(), e.what()));
  }
  checkpoint.restore(saved.model->parameters(), {}, saved.model->buffers());
  return saved;
}

}  // namespace kiln
