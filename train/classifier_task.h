// The image classifiers' task (lenet, resnet, resnet18, vgg, alexnet, inception, row-lstm):
// one training step (cross-entropy on shuffled, augmented batches), test accuracy and loss
// per epoch; and the data a config names (train/classifier_data.cpp).
#pragma once

#include <map>

#include "data/image_data.h"
#include "models/registry.h"
#include "train/config.h"

namespace kiln {

// The images a config trains on: its --data source (Fashion-MNIST from --data-dir or its
// default directory, CIFAR-10/100, an image folder), padded and normalised, or synthetic
// images (from the config's seed) of the model's shape or of --data synthetic:CxHxW's.
// kiln::Error naming the file for bad data, and naming what the model takes when it cannot
// take these images.
ImageData classifier_images(const TrainConfig& config);
// One split of classifier_images.
Dataset classifier_data(const TrainConfig& config, const ModelInfo& info, Split split);
// The loader's settings from the config's flags (kiln::Error for a malformed --mean/--std).
ImageDataOptions image_data_options(const TrainConfig& config);

// What a classifier's checkpoint says about its data, for `trainer predict`: "kiln.classes"
// (a JSON array of the class names), "kiln.input_shape" (CxHxW), "kiln.mean" and "kiln.std"
// (comma-separated, per channel).
std::map<std::string, std::string> image_metadata(const ImageData& data);

}  // namespace kiln
