// The link between training settings and checkpoints: what the training loop writes into a
// checkpoint's metadata, the checks before resuming, and loading a trained classifier back
// (trainer eval / predict).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "train/checkpoint.h"
#include "models/registry.h"
#include "train/config.h"

namespace kiln {

// The metadata of a training checkpoint: "model", "kiln.config" (the settings of its task,
// as the JSON of config_file.h), "kiln.data_seed" (the seed of the data order; with
// kiln.epoch and kiln.batch it fixes the data from where the run stopped) and
// "kiln.world_size" (the ranks, whose batches together make the global batch).
std::map<std::string, std::string> training_metadata(const TrainConfig& config);

// The settings a checkpoint was trained with. Checkpoints older than kiln.config (and the
// GANs' and LM's before the one loop, which kept loose keys: batch_size, seed, hidden, ...)
// give what they have. kiln::Error naming the file if it names no model or its JSON is invalid.
TrainConfig checkpoint_config(const Checkpoint& checkpoint);

// kiln::Error unless `config` can continue the run of `checkpoint`: the same model, global
// batch, data (synthetic or not) and data seed, so that its position means the same batches.
void check_resumable(const TrainConfig& config, const Checkpoint& checkpoint);

struct SavedClassifier {
  TrainConfig config;  // as trained
  std::unique_ptr<nn::Layer> model;
  std::int64_t step = 0;  // training steps done when it was saved
};

// Builds the image classifier named in the checkpoint and loads its parameters.
// kiln::Error naming the file for a missing or corrupt file, an unknown model, a model that
// is not an image classifier, or tensors that do not fit the model.
SavedClassifier load_classifier(const std::filesystem::path& path);

}  // namespace kiln
