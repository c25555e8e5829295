// Loading a classifier's images: the source, the padding, the per-channel normalisation.
#include "data/image_data.h"

#include <charconv>
#include <cmath>

namespace kiln {
namespace {

RawImages fashion_mnist_split(const std::string& dir, Split split) {
  Dataset d = load_fashion_mnist(dir, split, PixelScale::raw);
  std::vector<std::string> names;
  for (std::int64_t c = 0; c < 10; ++c) names.push_back(fashion_mnist_class_name(c));
  return {d.images, d.labels, names};
}

RawSplits load_raw(const ImageDataOptions& o) {
  const DataSource& s = o.source;
  if (s.kind == "fashion-mnist") {
    const std::string dir = s.dir.empty() ? kFashionMnistDir : s.dir;
    return {fashion_mnist_split(dir, Split::train), fashion_mnist_split(dir, Split::test)};
  }
  if (s.kind == "cifar10") return load_cifar10(s.dir);
  if (s.kind == "cifar100") return load_cifar100(s.dir);
  KILN_CHECK(s.kind == "folder", "data source '{}' has no loader of files", s.kind);
  return load_image_folder(s.dir, o.folder);
}

// One value for every channel, or one per channel.
std::vector<float> per_channel(const std::vector<float>& given, std::int64_t channels,
                               const char* what) {
  if (given.size() == 1) return std::vector<float>(static_cast<std::size_t>(channels), given[0]);
  KILN_CHECK(static_cast<std::int64_t>(given.size()) == channels,
             "--{} has {} values but the images have {} channels (give 1 or {})", what,
             given.size(), channels, channels);
  return given;
}

ChannelStats statistics(const ImageDataOptions& o, const Tensor& train_pixels) {
  const std::int64_t channels = train_pixels.shape()[1];
  ChannelStats s;
  if (o.mean.empty() || o.std.empty()) {
    s = o.source.kind == "fashion-mnist" ? ChannelStats{{kFashionMnistMean}, {kFashionMnistStd}}
                                         : channel_stats(train_pixels);
  }
  if (!o.mean.empty()) s.mean = per_channel(o.mean, channels, "mean");
  if (!o.std.empty()) s.std = per_channel(o.std, channels, "std");
  for (const float v : s.std)
    KILN_CHECK(v > 0 && std::isfinite(v),
               "the standard deviation of a channel is {} (give --std > 0 for constant images)", v);
  return s;
}

}  // namespace

ChannelStats channel_stats(const Tensor& pixels) {
  const Shape& s = pixels.shape();
  const std::int64_t n = s[0], channels = s[1], plane = s[2] * s[3];
  ChannelStats out;
  const std::uint8_t* p = pixels.data<std::uint8_t>();
  for (std::int64_t c = 0; c < channels; ++c) {
    double sum = 0, squares = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint8_t* at = p + (i * channels + c) * plane;
      for (std::int64_t k = 0; k < plane; ++k) {
        const double v = at[k] / 255.0;
        sum += v;
        squares += v * v;
      }
    }
    const double count = static_cast<double>(n * plane), mean = sum / count;
    out.mean.push_back(static_cast<float>(mean));
    out.std.push_back(static_cast<float>(std::sqrt(std::max(0.0, squares / count - mean * mean))));
  }
  return out;
}

Tensor normalise(const Tensor& pixels, const ChannelStats& stats) {
  const Shape& s = pixels.shape();
  const std::int64_t channels = s[1], plane = s[2] * s[3];
  KILN_CHECK(static_cast<std::int64_t>(stats.mean.size()) == channels &&
                 static_cast<std::int64_t>(stats.std.size()) == channels,
             "normalise: {} channel statistics for images {}", stats.mean.size(), s.str());
  Tensor out = Tensor::empty(s, DType::f32);
  const std::uint8_t* in = pixels.data<std::uint8_t>();
  float* o = out.data<float>();
  // A plane at a time, its channel's statistics hoisted: a loop the compiler vectorizes (with
  // the channel found per pixel, Fashion-MNIST's 55 M pixels took 0.6 s of the trainer's start).
  const std::int64_t planes = plane == 0 ? 0 : pixels.numel() / plane;
  for (std::int64_t p = 0; p < planes; ++p) {
    const auto c = static_cast<std::size_t>(p % channels);
    const float mean = stats.mean[c], std = stats.std[c];
    const std::uint8_t* from = in + p * plane;
    float* to = o + p * plane;
    for (std::int64_t k = 0; k < plane; ++k)
      to[k] = (static_cast<float>(from[k]) / 255.0f - mean) / std;
  }
  return out;
}

Tensor pad_images(const Tensor& pixels, std::int64_t pad) {
  if (pad == 0) return pixels;
  const Shape& s = pixels.shape();
  const std::int64_t h = s[2], w = s[3], out_h = h + 2 * pad, out_w = w + 2 * pad;
  Tensor out = Tensor::zeros({s[0], s[1], out_h, out_w}, DType::u8);
  const std::uint8_t* in = pixels.data<std::uint8_t>();
  std::uint8_t* o = out.data<std::uint8_t>();
  for (std::int64_t plane = 0; plane < s[0] * s[1]; ++plane)
    for (std::int64_t y = 0; y < h; ++y)
      std::copy_n(in + (plane * h + y) * w, w, o + (plane * out_h + y + pad) * out_w + pad);
  return out;
}

ImageData load_image_data(const ImageDataOptions& o) {
  RawSplits raw = load_raw(o);
  raw.train.pixels = pad_images(raw.train.pixels, o.pad);
  raw.test.pixels = pad_images(raw.test.pixels, o.pad);
  ImageData d;
  d.stats = statistics(o, raw.train.pixels);
  d.train = {normalise(raw.train.pixels, d.stats), raw.train.labels};
  d.test = {normalise(raw.test.pixels, d.stats), raw.test.labels};
  d.classes = raw.train.classes;
  const std::vector<std::int64_t>& dims = d.train.images.shape().dims();
  d.example = Shape(std::vector<std::int64_t>(dims.begin() + 1, dims.end()));
  return d;
}

std::vector<float> parse_channel_values(const std::string& text, const std::string& where) {
  std::vector<float> values;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    float v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    KILN_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() &&
                   std::isfinite(v) && values.size() < 64,
               "{}: '{}' is not a list of numbers, one per channel (e.g. 0.49,0.48,0.45)", where,
               text.size() > 60 ? text.substr(0, 60) + "..." : text);
    values.push_back(v);
    at = comma + 1;
  }
  return values;
}

}  // namespace kiln
