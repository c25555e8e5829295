// CIFAR-10 and CIFAR-100 in their binary releases: fixed-size records of label bytes and
// 32x32x3 pixels (channel planes, row-major), checked record by record.
#include <filesystem>
#include <fstream>
#include <iterator>

#include "data/image_sources.h"

namespace kiln {
namespace {

constexpr std::int64_t kPixels = 3 * 32 * 32;

const std::vector<std::string> kCifar10Names = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                "dog",      "frog",       "horse", "ship", "truck"};

std::vector<char> read_whole(const std::string& path) {
  KILN_CHECK(std::filesystem::is_regular_file(path), "{}: missing (is this a CIFAR directory?)",
             path);
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "{}: cannot be opened", path);
  return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The records of one file: `label_bytes` labels then the pixels; label byte `used` is the
// class, below `classes`.
struct Records {
  std::vector<std::uint8_t> pixels;
  std::vector<std::int64_t> labels, other_labels;
};

void read_records(const std::string& path, int label_bytes, int used, std::int64_t classes,
                  Records& out) {
  const std::vector<char> bytes = read_whole(path);
  const std::int64_t record = label_bytes + kPixels, size = static_cast<std::int64_t>(bytes.size());
  KILN_CHECK(size > 0, "{}: empty (a CIFAR file holds records of {} bytes)", path, record);
  KILN_CHECK(size % record == 0,
             "{}: truncated record: {} bytes are {} records of {} bytes and {} bytes over", path,
             size, size / record, record, size % record);
  for (std::int64_t r = 0; r < size / record; ++r) {
    const auto* at = reinterpret_cast<const std::uint8_t*>(bytes.data() + r * record);
    KILN_CHECK(at[used] < classes, "{}: record {} has label {}, not a class in [0, {})", path, r,
               at[used], classes);
    out.labels.push_back(at[used]);
    if (label_bytes == 2) out.other_labels.push_back(at[1 - used]);
    out.pixels.insert(out.pixels.end(), at + label_bytes, at + record);
  }
}

RawImages to_raw(const Records& r, std::vector<std::string> classes) {
  const auto n = static_cast<std::int64_t>(r.labels.size());
  RawImages out{Tensor::empty({n, 3, 32, 32}, DType::u8), Tensor::empty({n}, DType::i64),
                std::move(classes)};
  std::copy(r.pixels.begin(), r.pixels.end(), out.pixels.data<std::uint8_t>());
  std::copy(r.labels.begin(), r.labels.end(), out.labels.data<std::int64_t>());
  return out;
}

// One name a line (batches.meta.txt, fine_label_names.txt), blank lines skipped; the
// fallback when the file is absent. kiln::Error if it names another number of classes.
std::vector<std::string> class_names(const std::string& path, std::vector<std::string> fallback) {
  if (!std::filesystem::exists(path)) return fallback;
  std::ifstream in(path);
  std::vector<std::string> names;
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  KILN_CHECK(names.size() == fallback.size(), "{}: names {} classes but the data has {}", path,
             names.size(), fallback.size());
  return names;
}

std::vector<std::string> numbered(std::int64_t n) {
  std::vector<std::string> names;
  for (std::int64_t i = 0; i < n; ++i) names.push_back(std::to_string(i));
  return names;
}

std::string in_dir(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

void check_directory(const std::string& dir, const char* what) {
  KILN_CHECK(std::filesystem::is_directory(dir), "{} directory '{}' does not exist", what, dir);
}

}  // namespace

RawSplits load_cifar10(const std::string& dir) {
  check_directory(dir, "CIFAR-10");
  const std::vector<std::string> names =
      class_names(in_dir(dir, "batches.meta.txt"), kCifar10Names);
  Records train, test;
  for (int b = 1; b <= 5; ++b)
    read_records(in_dir(dir, fmt::format("data_batch_{}.bin", b)), 1, 0, 10, train);
  read_records(in_dir(dir, "test_batch.bin"), 1, 0, 10, test);
  return {to_raw(train, names), to_raw(test, names)};
}

RawSplits load_cifar100(const std::string& dir) {
  check_directory(dir, "CIFAR-100");
  const std::vector<std::string> names =
      class_names(in_dir(dir, "fine_label_names.txt"), numbered(100));
  Records train, test;
  read_records(in_dir(dir, "train.bin"), 2, 1, 100, train);
  read_records(in_dir(dir, "test.bin"), 2, 1, 100, test);
  return {to_raw(train, names), to_raw(test, names)};
}

Tensor load_cifar100_coarse_labels(const std::string& path) {
  Records r;
  read_records(path, 2, 1, 100, r);
  Tensor out = Tensor::empty({static_cast<std::int64_t>(r.other_labels.size())}, DType::i64);
  for (std::size_t i = 0; i < r.other_labels.size(); ++i) {
    KILN_CHECK(r.other_labels[i] < 20, "{}: record {} has coarse label {}, not in [0, 20)", path, i,
               r.other_labels[i]);
    out.data<std::int64_t>()[i] = r.other_labels[i];
  }
  return out;
}

}  // namespace kiln
