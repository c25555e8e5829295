// In-memory labelled datasets and seeded, shuffled mini-batches.
#pragma once

#include <string>
#include <vector>

#include "core/philox.h"
#include "data/augment.h"
#include "core/tensor.h"

namespace kiln {

struct Dataset {
  Tensor images;  // f32 [N, C, H, W], normalised
  Tensor labels;  // i64 [N]
  std::int64_t size() const { return labels.numel(); }
};

enum class Split { train, test };

// Default location of Debian's dataset-fashion-mnist package.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// The Fashion-MNIST training set's pixel mean and standard deviation (pixels in [0, 1]).
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Fashion-MNIST's class names, by label.
const char* fashion_mnist_class_name(std::int64_t label);

enum class PixelScale {
  standardised,  // (p / 255 - kFashionMnistMean) / kFashionMnistStd: classifiers
  symmetric,     // p / 127.5 - 1, in [-1, 1]: GANs (a tanh generator's range)
  raw,           // the u8 pixels as stored (data/image_data.h normalises them)
};

// Loads Fashion-MNIST (or MNIST) from `dir`: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz],
// images as [N, 1, 28, 28] scaled by `scale` (f32; raw: u8).
// Throws kiln::Error naming the directory or file and the problem.
Dataset load_fashion_mnist(const std::string& dir, Split split,
                           PixelScale scale = PixelScale::standardised);

// Images of an IDX file (u8 [N, 28, 28], gzip or plain), normalised as load_fashion_mnist
// does: f32 [N, 1, 28, 28]. kiln::Error naming the file for another element type or size.
Tensor load_images(const std::string& path);

// Random labelled images of the right shape (benchmarks, tests); labels in [0, classes).
Dataset synthetic_images(std::int64_t n, const Shape& image_shape, std::int64_t classes,
                         std::uint64_t seed);

// Mini-batches over a dataset. Each epoch is a fresh permutation drawn from (seed, epoch),
// so a run is reproducible and can resume at any epoch. The last partial batch is dropped
// for training; `batches_per_epoch` says how many full batches an epoch has.
// Data parallelism: with `ranks` > 1 a step's global batch is batch_size * ranks examples
// of the one permutation, and rank `rank` gets its batch_size-example share of each, so
// the ranks together see exactly the batches a single process with the global batch would.
// With an active augmentation every image of a batch is augmented by its draw from (seed,
// epoch, its index in the dataset): the same images whatever the ranks, threads or resume.
class Batcher {
 public:
  Batcher(const Dataset& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
          int rank = 0, int ranks = 1, Augmentation augmentation = {});

  std::int64_t batches_per_epoch() const { return data_.size() / (batch_size_ * ranks_); }
  // Starts epoch `epoch` (shuffles if enabled).
  void start_epoch(std::int64_t epoch);
  // Copies batch `index` of the current epoch into images [B, ...] and labels [B].
  void fill(std::int64_t index, Tensor& images, Tensor& labels) const;
  // Copies examples [begin, end) of batch `index` (the rest untouched): a share of fill's
  // work, which threads can do side by side.
  void fill_range(std::int64_t index, std::int64_t begin, std::int64_t end, Tensor& images,
                  Tensor& labels) const;

 private:
  const Dataset& data_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  int rank_, ranks_;
  Augmentation augmentation_;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> order_;
};

}  // namespace kiln
