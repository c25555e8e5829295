// Training settings in checkpoint metadata, resume checks, loading trained classifiers.
#include "train/saved_classifier.h"

#include "train/config_file.h"

namespace kiln {

std::map<std::string, std::string> training_metadata(const TrainConfig& config) {
  return {{"model", config.model},
          {"kiln.config", train_config_json(config)},
          {"kiln.data_seed", std::to_string(config.seed)},
          {"kiln.world_size", std::to_string(config.world_size)}};
}

TrainConfig checkpoint_config(const Checkpoint& checkpoint) {
  const std::string path = checkpoint.path().string();
  const std::string json = checkpoint.metadata_value("kiln.config");
  if (!json.empty())
    return parse_train_config(json, path + ": metadata 'kiln.config'", TrainConfig{});
  TrainConfig config;
  config.model = checkpoint.metadata_value("model");
  KILN_CHECK(!config.model.empty(), "{}: not a training checkpoint (its metadata names no model)",
             path);
  return config;
}

void check_resumable(const TrainConfig& c, const Checkpoint& checkpoint) {
  const std::string path = checkpoint.path().string();
  const std::string model = checkpoint.metadata_value("model");
  KILN_CHECK(model.empty() || model == c.model,
             "--resume {}: a checkpoint of model '{}', but this run trains '{}'", path, model,
             c.model);
  if (checkpoint.metadata_value("kiln.config").empty())
    return;  // older checkpoints: the tensors are checked on restore
  const TrainConfig saved = checkpoint_config(checkpoint);
  // A run on N ranks trains on the global batch batch_size * N: a checkpoint resumes on any
  // number of ranks (or the CPU) whose global batch is the same.
  const std::string ranks = checkpoint.metadata_value("kiln.world_size");
  std::int64_t saved_world = 1;
  if (!ranks.empty()) {
    std::size_t used = 0;
    try {
      saved_world = std::stoll(ranks, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    KILN_CHECK(used == ranks.size() && saved_world >= 1,
               "--resume {}: metadata 'kiln.world_size' is '{}', not a rank count", path, ranks);
  }
  const std::int64_t saved_global = saved.batch_size * saved_world,
                     global = c.batch_size * c.world_size;
  if (saved_world == 1 && c.world_size == 1)
    KILN_CHECK(saved.batch_size == c.batch_size,
               "--resume {}: the checkpoint was written with batch size {} but this run has {} "
               "(its data position would not match)",
               path, saved.batch_size, c.batch_size);
  KILN_CHECK(saved_global == global,
             "--resume {}: the checkpoint was written with a global batch of {} ({} x {} ranks) "
             "but this run has {} ({} x {} ranks): "
             "its data position would not match",
             path, saved_global, saved.batch_size, saved_world, global, c.batch_size, c.world_size);
  KILN_CHECK(saved.synthetic == c.synthetic,
             "--resume {}: the checkpoint was trained on {} data but this run uses {}", path,
             saved.synthetic ? "synthetic" : "real", c.synthetic ? "synthetic" : "real");
  const std::string data_seed = checkpoint.metadata_value("kiln.data_seed");
  KILN_CHECK(
      data_seed.empty() || data_seed == std::to_string(c.seed),
      "--resume {}: the checkpoint's data order comes from seed {} but this run has --seed {}",
      path, data_seed, c.seed);
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
  Philox rng(saved.config.seed);
  saved.model = make_model(saved.config.model, rng);
  checkpoint.restore(saved.model->parameters(), {}, saved.model->buffers());
  return saved;
}

}  // namespace kiln
