// Fashion-MNIST loading with validation, synthetic data, and the batcher.
#include "data/dataset.h"

#include <array>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <utility>

#include "data/idx.h"

namespace kiln {
namespace {

std::string find_file(const std::string& dir, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    const std::string path = (std::filesystem::path(dir) / (stem + suffix)).string();
    if (std::filesystem::exists(path)) return path;
  }
  throw Error(fmt::format("{}: missing {}[.gz] (is this a Fashion-MNIST directory?)", dir, stem));
}

Tensor normalised_images(const Tensor& raw, const std::string& path, PixelScale scale) {
  KILN_CHECK(raw.dtype() == DType::u8 && raw.shape().rank() == 3 && raw.shape()[1] == 28 &&
                 raw.shape()[2] == 28,
             "{}: expected u8 images [N, 28, 28] (28x28 Fashion-MNIST images) but found {}{}", path,
             dtype_name(raw.dtype()), raw.shape().str());
  if (scale == PixelScale::raw) return raw.reshape({raw.shape()[0], 1, 28, 28});
  Tensor out = Tensor::empty({raw.shape()[0], 1, 28, 28}, DType::f32);
  const std::uint8_t* in = raw.data<std::uint8_t>();
  float* o = out.data<float>();
  if (scale == PixelScale::symmetric) {
    for (std::int64_t i = 0; i < raw.numel(); ++i) o[i] = static_cast<float>(in[i]) / 127.5f - 1.0f;
    return out;
  }
  for (std::int64_t i = 0; i < raw.numel(); ++i)
    o[i] = (static_cast<float>(in[i]) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  return out;
}

Tensor checked_labels(const Tensor& raw, const std::string& path, std::int64_t classes) {
  KILN_CHECK(raw.dtype() == DType::u8 && raw.shape().rank() == 1,
             "{}: expected u8 labels [N] but found {}{}", path, dtype_name(raw.dtype()),
             raw.shape().str());
  Tensor out = Tensor::empty(raw.shape(), DType::i64);
  const std::uint8_t* in = raw.data<std::uint8_t>();
  for (std::int64_t i = 0; i < raw.numel(); ++i) {
    KILN_CHECK(in[i] < classes, "{}: label {} at index {} is not a class in [0, {})", path, in[i],
               i, classes);
    out.data<std::int64_t>()[i] = in[i];
  }
  return out;
}

}  // namespace

const char* fashion_mnist_class_name(std::int64_t label) {
  static constexpr std::array<const char*, 10> names = {
      "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
      "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  KILN_CHECK(label >= 0 && label < 10, "Fashion-MNIST has classes 0 to 9, not {}", label);
  return names[static_cast<std::size_t>(label)];
}

Dataset load_fashion_mnist(const std::string& dir, Split split, PixelScale scale) {
  KILN_CHECK(std::filesystem::is_directory(dir),
             "data directory '{}' does not exist (install Debian's dataset-fashion-mnist or pass "
             "--data-dir)",
             dir);
  const std::string prefix = split == Split::train ? "train" : "t10k";
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  Dataset d{normalised_images(read_idx(images_path), images_path, scale),
            checked_labels(read_idx(labels_path), labels_path, 10)};
  KILN_CHECK(d.images.shape()[0] == d.labels.numel(), "{}: {} images but {} has {} labels",
             images_path, d.images.shape()[0], labels_path, d.labels.numel());
  return d;
}

Tensor load_images(const std::string& path) {
  return normalised_images(read_idx(path), path, PixelScale::standardised);
}

Dataset synthetic_images(std::int64_t n, const Shape& image_shape, std::int64_t classes,
                         std::uint64_t seed) {
  std::vector<std::int64_t> dims = {n};
  dims.insert(dims.end(), image_shape.dims().begin(), image_shape.dims().end());
  Dataset d{Tensor::empty(Shape(dims), DType::f32), Tensor::empty({n}, DType::i64)};
  Philox rng(seed);
  rng.fill_normal(d.images, 0.0, 1.0);
  for (std::int64_t i = 0; i < n; ++i)
    d.labels.data<std::int64_t>()[i] =
        static_cast<std::int64_t>(rng.next_below(static_cast<std::uint64_t>(classes)));
  return d;
}

Batcher::Batcher(const Dataset& data, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                 int rank, int ranks, Augmentation augmentation)
    : data_(data),
      batch_size_(batch_size),
      shuffle_(shuffle),
      seed_(seed),
      rank_(rank),
      ranks_(ranks),
      augmentation_(std::move(augmentation)) {
  KILN_CHECK(batch_size > 0, "batch size {} must be positive", batch_size);
  KILN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "batcher: rank {} of {} ranks", rank, ranks);
  KILN_CHECK(batch_size * ranks <= data.size(),
             "batch size {}{} is larger than the dataset ({} examples)", batch_size * ranks,
             ranks > 1 ? fmt::format(" ({} x {} ranks)", batch_size, ranks) : "", data.size());
  KILN_CHECK(!augmentation_.active() || data.images.shape().rank() == 4,
             "augmentation needs images [N, C, H, W], not {}", data.images.shape().str());
  order_.resize(static_cast<std::size_t>(data.size()));
  std::iota(order_.begin(), order_.end(), 0);
}

void Batcher::start_epoch(std::int64_t epoch) {
  epoch_ = epoch;
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  Philox rng(seed_ ^ 0x5eed5eedULL, static_cast<std::uint64_t>(epoch) << 40);
  for (std::size_t i = order_.size(); i > 1; --i)
    std::swap(order_[i - 1], order_[rng.next_below(i)]);
}

void Batcher::fill(std::int64_t index, Tensor& images, Tensor& labels) const {
  fill_range(index, 0, batch_size_, images, labels);
}

void Batcher::fill_range(std::int64_t index, std::int64_t begin, std::int64_t end, Tensor& images,
                         Tensor& labels) const {
  const std::int64_t per_image = data_.images.numel() / data_.size();
  KILN_CHECK(index >= 0 && index < batches_per_epoch(),
             "batch {} is outside the epoch's {} batches", index, batches_per_epoch());
  KILN_CHECK(images.shape()[0] == batch_size_ && images.numel() == batch_size_ * per_image &&
                 labels.numel() == batch_size_ && begin >= 0 && begin <= end && end <= batch_size_,
             "batch buffers are {} and {} but the batch is {} examples of {} values",
             images.shape().str(), labels.shape().str(), batch_size_, per_image);
  const float* src = data_.images.data<float>();
  const std::int64_t* src_labels = data_.labels.data<std::int64_t>();
  const Shape& shape = data_.images.shape();
  for (std::int64_t b = begin; b < end; ++b) {
    const std::int64_t item =
        order_[static_cast<std::size_t>((index * ranks_ + rank_) * batch_size_ + b)];
    float* out = images.data<float>() + b * per_image;
    labels.data<std::int64_t>()[b] = src_labels[item];
    if (!augmentation_.active()) {
      std::memcpy(out, src + item * per_image, static_cast<std::size_t>(per_image) * sizeof(float));
      continue;
    }
    augment_image(src + item * per_image, out, shape[1], shape[2], shape[3], augmentation_,
                  augment_draw(augmentation_, seed_, epoch_, item));
  }
}

}  // namespace kiln
