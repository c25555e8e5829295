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
  // From the metadata the classifier task writes (train/classifier_task.h's image_metadata);
  // an older checkpoint: the model's own input, Fashion-MNIST's names and statistics.
  Shape example;
  std::vector<std::string> classes;
  std::vector<float> mean, std;
};

// Builds the image classifier named in the checkpoint (for the input its metadata names)
// and loads its parameters.
// kiln::Error naming the file for a missing or corrupt file, an unknown model, a model that
// is not an image classifier, or tensors that do not fit the model.
SavedClassifier load_classifier(const std::filesystem::path& path);

// Whether the path names a PNG, JPEG or BMP file (by its extension).
bool is_image_file(const std::string& path);
// `trainer predict`'s input: one IDX file (u8 [N, H, W]) or image files, brought to the
// classifier's input (decoded in its channels, resized to its size less the training's
// --pad, padded, normalised with its statistics): f32 [N, C, H, W]. kiln::Error naming the
// file that cannot be read or brought to that shape.
Tensor prediction_inputs(const std::vector<std::string>& paths, const SavedClassifier& saved);

}  // namespace kiln
