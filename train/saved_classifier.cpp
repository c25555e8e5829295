// Training settings in checkpoint metadata, resume checks, loading trained classifiers.
#include "train/saved_classifier.h"

#include "core/log.h"
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
  const std::int64_t saved_world = saved_world_size(checkpoint);
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
    log().warn(
        "--resume {}: trained in {} so far, continuing in {} (master weights and optimizer state "
        "are fp32 in both)",
        path, precision_name(precision_of(saved.device)), precision_name(precision_of(c.device)));
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
  Philox rng(saved.config.loop.seed);
  saved.model = make_model(saved.config.model, rng);
  checkpoint.restore(saved.model->parameters(), {}, saved.model->buffers());
  return saved;
}

}  // namespace kiln
