// The image sources on datasets the tests write themselves: CIFAR-10 and CIFAR-100 binaries
// and folders of PNG, JPEG and BMP files: loading, labels, class names, every error naming
// its file; the per-channel statistics and normalisation; the --data spec.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/idx.h"
#include "data/image_data.h"
#include "train/saved_classifier.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

struct Scratch {
  fs::path path;
  Scratch() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("kiln-image-data-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

void write_file(const std::string& path, const Bytes& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

// The pixel every test image has at (channel, y, x) for example `id`.
std::uint8_t pixel(std::int64_t id, std::int64_t c, std::int64_t y, std::int64_t x) {
  return static_cast<std::uint8_t>((id * 37 + c * 80 + y * 3 + x * 5) % 256);
}

// CIFAR records: the label bytes, then 3x32x32 pixels in channel planes.
Bytes cifar_records(const std::vector<std::vector<std::uint8_t>>& labels, std::int64_t first_id) {
  Bytes out;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    out.insert(out.end(), labels[r].begin(), labels[r].end());
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t y = 0; y < 32; ++y)
        for (std::int64_t x = 0; x < 32; ++x)
          out.push_back(pixel(first_id + static_cast<std::int64_t>(r), c, y, x));
  }
  return out;
}

// A tiny CIFAR-10: batch b holds two records of labels (b, b + 5) % 10; the test batch three.
void write_cifar10(const Scratch& dir) {
  for (int b = 1; b <= 5; ++b)
    write_file(dir / fmt::format("data_batch_{}.bin", b),
               cifar_records({{std::uint8_t(b % 10)}, {std::uint8_t((b + 5) % 10)}}, 2 * (b - 1)));
  write_file(dir / "test_batch.bin", cifar_records({{7}, {0}, {9}}, 100));
}

// An image of `channels` (1 or 3) x h x w, interleaved as stb_image_write takes it.
std::vector<std::uint8_t> interleaved(std::int64_t id, int channels, int h, int w) {
  std::vector<std::uint8_t> p;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c) p.push_back(pixel(id, c, y, x));
  return p;
}

void write_image(const std::string& path, std::int64_t id, int channels, int h, int w) {
  fs::create_directories(fs::path(path).parent_path());
  const std::vector<std::uint8_t> p = interleaved(id, channels, h, w);
  const std::string ext = fs::path(path).extension().string();
  int ok = 0;
  if (ext == ".png") ok = stbi_write_png(path.c_str(), w, h, channels, p.data(), w * channels);
  if (ext == ".bmp") ok = stbi_write_bmp(path.c_str(), w, h, channels, p.data());
  if (ext == ".jpg") ok = stbi_write_jpg(path.c_str(), w, h, channels, p.data(), 100);
  REQUIRE(ok != 0);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("CIFAR-10: records in file order, labels, pixels in channel planes, class names") {
  Scratch dir;
  write_cifar10(dir);
  const RawSplits d = load_cifar10(dir.path.string());
  REQUIRE(d.train.size() == 10);
  REQUIRE(d.test.size() == 3);
  CHECK(d.train.pixels.shape() == Shape{10, 3, 32, 32});
  CHECK(d.train.labels.data<std::int64_t>()[0] == 1);
  CHECK(d.train.labels.data<std::int64_t>()[1] == 6);
  CHECK(d.train.labels.data<std::int64_t>()[8] == 5);  // batch 5's first record
  CHECK(d.test.labels.data<std::int64_t>()[2] == 9);
  const std::uint8_t* p = d.train.pixels.data<std::uint8_t>();
  CHECK(p[(3 * 3 + 2) * 1024 + 5 * 32 + 7] == pixel(3, 2, 5, 7));  // example 3, blue, (5, 7)
  CHECK(d.test.pixels.data<std::uint8_t>()[1024 + 31] == pixel(100, 1, 0, 31));
  REQUIRE(d.train.classes.size() == 10);
  CHECK(d.train.classes[0] == "airplane");
  CHECK(d.train.classes[9] == "truck");

  std::ofstream(dir / "batches.meta.txt") << "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n\n";
  CHECK(load_cifar10(dir.path.string()).train.classes[9] == "j");
  std::ofstream(dir / "batches.meta.txt") << "a\nb\n";
  CHECK(error_of([&] { load_cifar10(dir.path.string()); }).find("names 2 classes") !=
        std::string::npos);
}

TEST_CASE("CIFAR-10: a truncated record, a bad label and a missing file name the file") {
  Scratch dir;
  write_cifar10(dir);
  Bytes cut = cifar_records({{1}, {2}}, 0);
  cut.resize(cut.size() - 100);
  write_file(dir / "data_batch_3.bin", cut);
  std::string e = error_of([&] { load_cifar10(dir.path.string()); });
  CHECK(e.find("data_batch_3.bin: truncated record") != std::string::npos);
  CHECK(e.find("1 records of 3073 bytes and 2973 bytes over") != std::string::npos);

  write_file(dir / "data_batch_3.bin", cifar_records({{1}, {10}}, 0));
  e = error_of([&] { load_cifar10(dir.path.string()); });
  CHECK(e.find("data_batch_3.bin: record 1 has label 10, not a class in [0, 10)") !=
        std::string::npos);

  fs::remove(dir / "test_batch.bin");
  write_file(dir / "data_batch_3.bin", cifar_records({{1}}, 0));
  CHECK(error_of([&] { load_cifar10(dir.path.string()); }).find("test_batch.bin: missing") !=
        std::string::npos);
  CHECK(error_of([] { load_cifar10("/nonexistent-kiln"); }).find("does not exist") !=
        std::string::npos);
}

TEST_CASE("CIFAR-100: the fine labels train, the coarse ones read back, names from the file") {
  Scratch dir;
  write_file(dir / "train.bin", cifar_records({{3, 99}, {19, 0}, {0, 42}}, 0));
  write_file(dir / "test.bin", cifar_records({{5, 57}}, 10));
  RawSplits d = load_cifar100(dir.path.string());
  REQUIRE(d.train.size() == 3);
  CHECK(d.train.labels.data<std::int64_t>()[0] == 99);
  CHECK(d.train.labels.data<std::int64_t>()[1] == 0);
  CHECK(d.train.labels.data<std::int64_t>()[2] == 42);
  CHECK(d.test.labels.data<std::int64_t>()[0] == 57);
  CHECK(d.train.pixels.data<std::uint8_t>()[2 * 3072 + 77] == pixel(2, 0, 2, 13));
  const Tensor coarse = load_cifar100_coarse_labels(dir / "train.bin");
  CHECK(coarse.data<std::int64_t>()[0] == 3);
  CHECK(coarse.data<std::int64_t>()[1] == 19);
  CHECK(d.train.classes.size() == 100);
  CHECK(d.train.classes[57] == "57");
  std::string names;
  for (int i = 0; i < 100; ++i) names += fmt::format("fine{}\n", i);
  std::ofstream(dir / "fine_label_names.txt") << names;
  CHECK(load_cifar100(dir.path.string()).test.classes[57] == "fine57");

  write_file(dir / "test.bin", cifar_records({{5, 100}}, 10));
  CHECK(error_of([&] {
          load_cifar100(dir.path.string());
        }).find("test.bin: record 0 has label 100, not a class in [0, 100)") != std::string::npos);
  Bytes cut = cifar_records({{1, 1}}, 0);
  cut.pop_back();
  write_file(dir / "train.bin", cut);
  CHECK(error_of([&] {
          load_cifar100(dir.path.string());
        }).find("train.bin: truncated record: 3073 bytes are 0 records of 3074 bytes") !=
        std::string::npos);
}

TEST_CASE("image folder: PNG, JPEG and BMP classes by sorted folder name, exact pixels") {
  Scratch dir;
  write_image(dir / "train/cat/a.png", 1, 3, 6, 5);
  write_image(dir / "train/cat/b.bmp", 2, 3, 6, 5);
  write_image(dir / "train/ant/c.jpg", 3, 3, 6, 5);
  write_image(dir / "test/cat/d.png", 4, 3, 6, 5);
  write_image(dir / "test/ant/e.bmp", 5, 3, 6, 5);
  std::ofstream(dir / "train/cat/notes.txt") << "not an image";  // skipped: not an image file
  const RawSplits d = load_image_folder(dir.path.string(), {});
  REQUIRE(d.train.classes == std::vector<std::string>{"ant", "cat"});
  REQUIRE(d.train.size() == 3);
  CHECK(d.train.pixels.shape() == Shape{3, 3, 6, 5});
  // Files in order: ant/c.jpg (label 0), cat/a.png, cat/b.bmp (label 1).
  CHECK(d.train.labels.data<std::int64_t>()[0] == 0);
  CHECK(d.train.labels.data<std::int64_t>()[2] == 1);
  const std::uint8_t* p = d.train.pixels.data<std::uint8_t>();
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t y = 0; y < 6; ++y)
      for (std::int64_t x = 0; x < 5; ++x) {
        CHECK(p[90 + (c * 6 + y) * 5 + x] == pixel(1, c, y, x));   // PNG: lossless
        CHECK(p[180 + (c * 6 + y) * 5 + x] == pixel(2, c, y, x));  // BMP: lossless
        CHECK(std::abs(int(p[(c * 6 + y) * 5 + x]) - int(pixel(3, c, y, x))) < 40);  // JPEG
      }
  CHECK(d.test.size() == 2);
  CHECK(d.test.labels.data<std::int64_t>()[0] == 0);  // test/ant/e.bmp
}

TEST_CASE("image folder: grey images, resizing, and a folder split by a seeded fraction") {
  Scratch dir;
  for (int k = 0; k < 10; ++k) {
    write_image(dir / fmt::format("one/{}.png", k), k, 1, 8 + k, 8);
    write_image(dir / fmt::format("two/{}.png", k), k, 1, 8, 8);
  }
  std::string e = error_of([&] { load_image_folder(dir.path.string(), {}); });
  CAPTURE(e);
  CHECK(e.find(".png: 8x") != std::string::npos);  // the file, its size, another file's
  CHECK(e.find(" pixels but ") != std::string::npos);
  CHECK(e.find("images of mixed sizes need --image-size") != std::string::npos);
  CHECK(e.find("/one/") != std::string::npos);
  const FolderOptions o{.image_size = 4, .test_fraction = 0.2, .seed = 5};
  const RawSplits d = load_image_folder(dir.path.string(), o);
  CHECK(d.train.pixels.shape() == Shape{16, 1, 4, 4});
  CHECK(d.test.pixels.shape() == Shape{4, 1, 4, 4});
  std::int64_t test_twos = 0;
  for (std::int64_t i = 0; i < 4; ++i) test_twos += d.test.labels.data<std::int64_t>()[i];
  CHECK(test_twos == 2);  // two of each class
  const RawSplits again = load_image_folder(dir.path.string(), o);
  CHECK(std::equal(d.test.pixels.data<std::uint8_t>(), d.test.pixels.data<std::uint8_t>() + 64,
                   again.test.pixels.data<std::uint8_t>()));
  FolderOptions other = o;
  other.seed = 6;
  const RawSplits moved = load_image_folder(dir.path.string(), other);
  CHECK(!std::equal(d.test.pixels.data<std::uint8_t>(), d.test.pixels.data<std::uint8_t>() + 64,
                    moved.test.pixels.data<std::uint8_t>()));
}

TEST_CASE("image folder: an undecodable file, an empty class, one class, a stray test class") {
  Scratch dir;
  write_image(dir / "train/a/1.png", 1, 3, 4, 4);
  write_image(dir / "train/b/2.png", 2, 3, 4, 4);
  write_image(dir / "test/a/3.png", 3, 3, 4, 4);
  CHECK(load_image_folder(dir.path.string(), {}).test.size() == 1);
  write_file(dir / "train/b/broken.png", Bytes{0x89, 'P', 'N', 'G', 1, 2, 3});
  std::string e = error_of([&] { load_image_folder(dir.path.string(), {}); });
  CHECK(e.find("train/b/broken.png: not an image stb_image can decode") != std::string::npos);
  fs::remove(dir / "train/b/broken.png");
  fs::create_directories(dir / "train/c");
  e = error_of([&] { load_image_folder(dir.path.string(), {}); });
  CHECK(e.find("train/c: a class folder with no images") != std::string::npos);
  fs::remove_all(dir / "train/c");
  write_image(dir / "test/zebra/4.png", 4, 3, 4, 4);
  e = error_of([&] { load_image_folder(dir.path.string(), {}); });
  CHECK(e.find("class 'zebra' is not one of the training set's classes") != std::string::npos);
  fs::remove_all(dir / "test");
  fs::remove_all(dir / "train/b");
  e = error_of([&] { load_image_folder((dir.path / "train").string(), {}); });
  CHECK(e.find("1 class folders; a classifier needs at least 2") != std::string::npos);
}

TEST_CASE("decode_image: channels as asked, the size as asked, a missing file named") {
  Scratch dir;
  write_image(dir / "rgb.png", 7, 3, 3, 2);
  const Tensor grey = decode_image(dir / "rgb.png", 1);
  CHECK(grey.shape() == Shape{1, 3, 2});
  const Tensor big = decode_image(dir / "rgb.png", 3, 8);
  CHECK(big.shape() == Shape{3, 8, 8});
  CHECK(error_of([&] { decode_image(dir / "none.png"); }).find("none.png") != std::string::npos);
}

TEST_CASE("channel statistics, normalisation, padding and channel values from the flags") {
  Tensor pixels = Tensor::empty({2, 2, 1, 2}, DType::u8);
  const std::uint8_t values[] = {0, 255, 51, 51, 255, 255, 102, 102};  // [image][channel][x]
  std::copy(std::begin(values), std::end(values), pixels.data<std::uint8_t>());
  const ChannelStats s = channel_stats(pixels);
  CHECK(s.mean[0] == doctest::Approx(0.75));  // 0, 1, 1, 1
  CHECK(s.std[0] == doctest::Approx(std::sqrt(0.1875)));
  CHECK(s.mean[1] == doctest::Approx(0.3));  // 0.2, 0.2, 0.4, 0.4
  CHECK(s.std[1] == doctest::Approx(0.1));
  const Tensor n = normalise(pixels, s);
  CHECK(n.data<float>()[2] == doctest::Approx(-1.0));  // channel 1 of image 0: 0.2
  for (std::int64_t image = 0; image < 2; ++image)  // every pixel by its own channel's statistics
    for (std::size_t channel = 0; channel < 2; ++channel)
      for (std::int64_t x = 0; x < 2; ++x) {
        const std::int64_t i = (image * 2 + static_cast<std::int64_t>(channel)) * 2 + x;
        CHECK(n.data<float>()[i] ==
              (static_cast<float>(values[i]) / 255.0f - s.mean[channel]) / s.std[channel]);
      }
  const Tensor padded = pad_images(pixels, 1);
  CHECK(padded.shape() == Shape{2, 2, 3, 4});
  CHECK(padded.data<std::uint8_t>()[4 + 1] == 0);
  CHECK(padded.data<std::uint8_t>()[4 + 2] == 255);
  CHECK(parse_channel_values("0.5,0.25,1", "--mean") == std::vector<float>{0.5f, 0.25f, 1.0f});
  CHECK(error_of([] { parse_channel_values("0.5,,1", "--mean"); }).find("--mean") !=
        std::string::npos);
  CHECK(error_of([] { parse_channel_values("x", "--std"); }).find("not a list of numbers") !=
        std::string::npos);
}

TEST_CASE("load_image_data: statistics from the training set, given ones, and their checks") {
  Scratch dir;
  write_cifar10(dir);
  ImageDataOptions o{.source = parse_data_source("cifar10:" + dir.path.string()), .pad = 2};
  const ImageData d = load_image_data(o);
  CHECK(d.example == Shape{3, 36, 36});
  CHECK(d.classes[1] == "automobile");
  double sum = 0;  // normalised by its own statistics, the training set has mean 0 per channel
  for (std::int64_t i = 0; i < 10; ++i)
    for (std::int64_t k = 0; k < 36 * 36; ++k)
      sum += d.train.images.data<float>()[i * 3 * 1296 + k];
  CHECK(sum / (10 * 1296) == doctest::Approx(0).epsilon(1e-4));
  o.mean = {0.5f};
  o.std = {0.25f, 0.5f, 1.0f};
  const ImageData given = load_image_data(o);
  CHECK(given.stats.mean == std::vector<float>{0.5f, 0.5f, 0.5f});
  CHECK(given.train.images.data<float>()[0] == doctest::Approx(-2.0));  // the black border
  o.std = {1.0f, 1.0f};
  CHECK(error_of([&] { load_image_data(o); }).find("--std has 2 values but the images have 3") !=
        std::string::npos);
  o.std = {0.0f};
  CHECK(error_of([&] { load_image_data(o); }).find("standard deviation") != std::string::npos);
}

TEST_CASE("the --data spec: every source, shapes, and clear errors") {
  CHECK(parse_data_source("fashion-mnist").dir.empty());
  CHECK(parse_data_source("fashion-mnist:/d").dir == "/d");
  CHECK(parse_data_source("cifar100:/x:y").dir == "/x:y");
  CHECK(parse_data_source("synthetic:3x32x32").synthetic_shape ==
        std::vector<std::int64_t>{3, 32, 32});
  CHECK(error_of([] { parse_data_source("imagenet:/d"); }).find("is not a data source") !=
        std::string::npos);
  CHECK(error_of([] { parse_data_source("cifar10"); }).find("needs a directory") !=
        std::string::npos);
  for (const char* bad : {"3x32", "3x32x32x1", "0x4x4", "3x32xq", "3x5000x5000", "3x32x32 "})
    CHECK(error_of([&] {
            parse_data_source(std::string("synthetic:") + bad);
          }).find("is not an image shape CxHxW") != std::string::npos);
}

TEST_CASE("predict's inputs: image files resized to the training size, padded, normalised") {
  Scratch dir;
  write_image(dir / "small.png", 1, 3, 4, 4);
  write_image(dir / "big.bmp", 2, 3, 9, 9);
  write_image(dir / "grey.png", 3, 1, 4, 4);
  SavedClassifier s;
  s.example = Shape{3, 6, 6};
  s.config.images.pad = 1;  // trained on 4x4 images with a border of 1
  s.mean = {0.5f, 0.5f, 0.5f};
  s.std = {0.5f, 0.25f, 1.0f};
  const Tensor x = prediction_inputs({dir / "small.png", dir / "big.bmp", dir / "grey.png"}, s);
  CHECK(x.shape() == Shape{3, 3, 6, 6});
  const float* v = x.data<float>();
  CHECK(v[0] == doctest::Approx(-1.0));  // the border: black, normalised
  const float first = (static_cast<float>(pixel(1, 1, 0, 0)) / 255.0f - 0.5f) / 0.25f;
  CHECK(v[36 + 7] == doctest::Approx(first));  // channel 1, (1, 1): the image's (0, 0)
  const float* grey = v + 2 * 3 * 36 + 7;      // image 2, (1, 1): one value in all channels
  CHECK(grey[0] * 0.5f + 0.5f == doctest::Approx(grey[72] * 1.0f + 0.5f));
  CHECK(grey[0] * 0.5f + 0.5f == doctest::Approx(grey[36] * 0.25f + 0.5f));
  const auto error = [&](const std::vector<std::string>& paths) {
    return error_of([&] { prediction_inputs(paths, s); });
  };
  CHECK(error({dir / "small.png", dir / "x.idx"}).find("x.idx: not a PNG, JPEG or BMP file") !=
        std::string::npos);
  s.config.images.pad = 0;
  s.example = Shape{3, 4, 5};
  CHECK(error({dir / "big.bmp"}).find("only square sizes resize") != std::string::npos);
  write_idx(dir / "images.idx", Tensor::zeros({2, 4, 4}, DType::u8));
  CHECK(error({dir / "images.idx"}).find("images [2, 4, 4], but the model takes [3, 4, 5]") !=
        std::string::npos);
  s.example = Shape{1, 4, 4};
  s.mean = {0.0f};
  s.std = {1.0f};
  CHECK(prediction_inputs({dir / "images.idx"}, s).shape() == Shape{2, 1, 4, 4});
}

}  // namespace kiln
