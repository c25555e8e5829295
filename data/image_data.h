// The image classifiers' data: a source (data/image_sources.h) loaded, padded and
// normalised per channel into the f32 datasets the models train on, with its class names.
#pragma once

#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/image_sources.h"

namespace kiln {

// Per-channel statistics of pixels scaled to [0, 1].
struct ChannelStats {
  std::vector<float> mean, std;
};

// The mean and standard deviation of each channel over every image of u8 [N, C, H, W]
// (accumulated in double: the same bits for any order of loading).
ChannelStats channel_stats(const Tensor& pixels);
// u8 [N, C, H, W] -> f32 (p / 255 - mean[c]) / std[c].
Tensor normalise(const Tensor& pixels, const ChannelStats& stats);
// u8 [N, C, H, W] -> [N, C, H + 2 pad, W + 2 pad], the border black (0).
Tensor pad_images(const Tensor& pixels, std::int64_t pad);

struct ImageDataOptions {
  DataSource source;
  FolderOptions folder;
  std::int64_t pad = 0;  // black border added to every image (Fashion-MNIST to 32x32: 2)
  // Given statistics (one value or one per channel); empty: computed from the training set
  // (Fashion-MNIST: its published figures, kFashionMnistMean and kFashionMnistStd).
  std::vector<float> mean, std;
};

struct ImageData {
  Dataset train, test;
  std::vector<std::string> classes;
  ChannelStats stats;  // what normalised both
  Shape example;       // [C, H, W]
};

// kiln::Error naming the file or directory for data that is missing or malformed, and for
// statistics of the wrong length or a standard deviation that is not positive.
ImageData load_image_data(const ImageDataOptions& options);

// "0.49,0.48,0.45" -> {0.49f, 0.48f, 0.45f}; kiln::Error naming `where` otherwise.
std::vector<float> parse_channel_values(const std::string& text, const std::string& where);

}  // namespace kiln
