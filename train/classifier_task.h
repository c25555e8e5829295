// The image classifiers' task (lenet, resnet, vgg, alexnet, inception, row-lstm): one
// training step (cross-entropy on shuffled batches), test accuracy and loss per epoch.
#pragma once

#include "data/dataset.h"
#include "models/registry.h"
#include "train/config.h"

namespace kiln {

// The training or test set a config trains on: Fashion-MNIST from its data directory, or
// synthetic images of the model's input shape (from the config's seed).
Dataset classifier_data(const TrainConfig& config, const ModelInfo& info, Split split);

}  // namespace kiln
