// Training settings in checkpoint metadata, resume checks, loading trained classifiers.
#include "train/saved_classifier.h"

#include "core/log.h"
#include "train/config_file.h"

namespace kiln {
namespace {

// A count in the metadata (kiln.world_size, or an older checkpoint's loose key), or
// `fallback` when the key is missing.
std::int64_t metadata_count(const Checkpoint& checkpoint, const std::string& key,
                            std::int64_t fallback) {
  const std::string text = checkpoint.metadata_value(key);
  if (text.empty()) return fallback;
  std::size_t used = 0;
  std::int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used == text.size() && value >= 0, "--resume {}: metadata '{}' is '{}', not a count",
             checkpoint.path().string(), key, text);
  return value;
}

// The settings of a checkpoint written before kiln.config: the GANs and the LM kept some
// as loose keys ("batch_size", "seed", "hidden", ...); classifiers only the model.
TrainConfig legacy_config(const Checkpoint& checkpoint, TrainConfig config) {
  config.loop.batch_size = metadata_count(checkpoint, "batch_size", config.loop.batch_size);
  config.loop.seed = static_cast<std::uint64_t>(
      metadata_count(checkpoint, "seed", static_cast<std::int64_t>(config.loop.seed)));
  config.lm.embedding = metadata_count(checkpoint, "embedding", config.lm.embedding);
  config.lm.hidden = metadata_count(checkpoint, "hidden", config.lm.hidden);
  config.lm.layers = metadata_count(checkpoint, "layers", config.lm.layers);
  config.lm.seq_len = metadata_count(checkpoint, "seq_len", config.lm.seq_len);
  if (!checkpoint.metadata_value("cell").empty())
    config.lm.cell = checkpoint.metadata_value("cell");
  return config;
}

}  // namespace

std::map<std::string, std::string> training_metadata(const TrainConfig& config) {
  return {{"model", config.model},
          {"kiln.config", train_config_json(config)},
          {"kiln.data_seed", std::to_string(config.loop.seed)},
          {"kiln.world_size", std::to_string(config.parallel.world_size)}};
}

TrainConfig checkpoint_config(const Checkpoint& checkpoint) {
  const std::string path = checkpoint.path().string();
  const std::string json = checkpoint.metadata_value("kiln.config");
  if (!json.empty())
    return parse_train_config(json, path + ": metadata 'kiln.config'", TrainConfig{}, nullptr,
                              true);
  TrainConfig config;
  config.model = checkpoint.metadata_value("model");
  KILN_CHECK(!config.model.empty(), "{}: not a training checkpoint (its metadata names no model)",
             path);
  return legacy_config(checkpoint, config);
}

void check_resumable(const TrainConfig& c, const Checkpoint& checkpoint) {
  const std::string path = checkpoint.path().string();
  const std::string model = checkpoint.metadata_value("model");
  KILN_CHECK(model.empty() || model == c.model,
             "--resume {}: a checkpoint of model '{}', but this run trains '{}'", path, model,
             c.model);
  const bool has_config = !checkpoint.metadata_value("kiln.config").empty();
  if (model.empty() || (!has_config && checkpoint.metadata_value("batch_size").empty()))
    return;  // no settings to compare: the tensors are checked on restore
  const TrainConfig saved = checkpoint_config(checkpoint);
  // A run on N ranks trains on the global batch batch_size * N: a checkpoint resumes on any
  // number of ranks (or the CPU) whose global batch is the same.
  const std::int64_t saved_world = metadata_count(checkpoint, "kiln.world_size", 1);
  KILN_CHECK(saved_world >= 1, "--resume {}: metadata 'kiln.world_size' is 0", path);
  const std::int64_t batch = c.loop.batch_size, world = c.parallel.world_size;
  if (saved_world == 1 && world == 1)
    KILN_CHECK(saved.loop.batch_size == batch,
               "--resume {}: the checkpoint was written with batch size {} but this run has {} "
               "(its data position would not match)",
               path, saved.loop.batch_size, batch);
  KILN_CHECK(saved.loop.batch_size * saved_world == batch * world,
             "--resume {}: the checkpoint was written with a global batch of {} ({} x {} ranks) "
             "but this run has {} ({} x {} ranks): its data position would not match",
             path, saved.loop.batch_size * saved_world, saved.loop.batch_size, saved_world,
             batch * world, batch, world);
  KILN_CHECK(!has_config || saved.images.synthetic == c.images.synthetic,
             "--resume {}: the checkpoint was trained on {} data but this run uses {}", path,
             saved.images.synthetic ? "synthetic" : "real",
             c.images.synthetic ? "synthetic" : "real");
  if (has_config && precision_of(saved.device) != precision_of(c.device))
    log().info(
        "--resume {}: trained in {} so far, continuing in {} (master weights and optimizer state "
        "are fp32 in both)",
        path, precision_name(precision_of(saved.device)), precision_name(precision_of(c.device)));
  const std::string data_seed = checkpoint.metadata_value("kiln.data_seed");
  const std::string seed = data_seed.empty() ? checkpoint.metadata_value("seed") : data_seed;
  KILN_CHECK(
      seed.empty() || seed == std::to_string(c.loop.seed),
      "--resume {}: the checkpoint's data order comes from seed {} but this run has --seed {}",
      path, seed, c.loop.seed);
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
  Philox rng(saved.config.loop.seed);
  saved.model = make_model(saved.config.model, rng);
  checkpoint.restore(saved.model->parameters(), {}, saved.model->buffers());
  return saved;
}

}  // namespace kiln
