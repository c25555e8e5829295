// The link between training settings and checkpoints: what train_classifier writes into a
// checkpoint's metadata, and loading a trained classifier back (trainer eval / predict).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "train/checkpoint.h"
#include "models/registry.h"
#include "train/train.h"

namespace kiln {

// The metadata of a training checkpoint: "model", "kiln.config" (every config key, as the
// JSON of config_file.h) and "kiln.data_seed" (the seed of the batcher's shuffling; with
// kiln.epoch and kiln.batch it fixes the data order from where the run stopped).
std::map<std::string, std::string> training_metadata(const TrainConfig& config);

// The settings a checkpoint was trained with (only the model for checkpoints older than
// kiln.config). kiln::Error naming the file if neither is there or the JSON is invalid.
TrainConfig checkpoint_config(const Checkpoint& checkpoint);

// kiln::Error unless `config` can continue the run of `checkpoint`: the same model, batch
// size, data (synthetic or not) and data seed, so that its position means the same batches.
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
