// Folders of images, one subfolder a class, decoded with stb_image and resized with
// stb_image_resize; a folder without train/ and test/ is split by a seeded fraction.
#include <stb/stb_image.h>
#include <stb/stb_image_resize.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <memory>

#include "core/philox.h"
#include "data/image_sources.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

struct LabelledFile {
  std::string path;
  std::int64_t label;
};

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

std::vector<std::string> sorted_subfolders(const fs::path& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> images_in(const fs::path& class_dir) {
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(class_dir))
    if (e.is_regular_file() && is_image_file(e.path())) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  KILN_CHECK(!files.empty(), "{}: a class folder with no images (.png, .jpg, .jpeg or .bmp)",
             class_dir.string());
  return files;
}

// The files of every class folder of `dir`, labelled by `classes` (kiln::Error for a folder
// that is not one of them).
std::vector<LabelledFile> labelled_files(const fs::path& dir,
                                         const std::vector<std::string>& classes) {
  std::vector<LabelledFile> files;
  for (const std::string& name : sorted_subfolders(dir)) {
    const auto it = std::find(classes.begin(), classes.end(), name);
    KILN_CHECK(it != classes.end(), "{}: class '{}' is not one of the training set's classes",
               (dir / name).string(), name);
    for (std::string& f : images_in(dir / name))
      files.push_back({std::move(f), it - classes.begin()});
  }
  return files;
}

// Splits `all` class by class: a share `fraction` of each class (drawn with `seed`) is the test
// set.
void split_files(std::vector<LabelledFile> all, std::int64_t classes, const FolderOptions& o,
                 std::vector<LabelledFile>& train, std::vector<LabelledFile>& test) {
  Philox rng(o.seed ^ 0xf01de25ULL);
  for (std::int64_t c = 0; c < classes; ++c) {
    std::vector<LabelledFile> mine;
    for (const LabelledFile& f : all)
      if (f.label == c) mine.push_back(f);
    for (std::size_t i = mine.size(); i > 1; --i) std::swap(mine[i - 1], mine[rng.next_below(i)]);
    const auto n = static_cast<std::int64_t>(mine.size());
    const std::int64_t n_test =
        std::min(n - 1, static_cast<std::int64_t>(static_cast<double>(n) * o.test_fraction + 0.5));
    for (std::int64_t i = 0; i < n; ++i) (i < n_test ? test : train).push_back(mine[i]);
  }
}

struct ImageInfo {
  int width = 0, height = 0, channels = 0;
};

ImageInfo image_info(const std::string& path) {
  ImageInfo info;
  KILN_CHECK(stbi_info(path.c_str(), &info.width, &info.height, &info.channels) != 0,
             "{}: not an image stb_image can decode ({})", path, stbi_failure_reason());
  return info;
}

// The channels (1 or 3) and size every image decodes to; kiln::Error naming the first file
// whose size differs when no size is given.
ImageInfo common_format(const std::vector<LabelledFile>& files, std::int64_t size) {
  ImageInfo common;
  std::string first;
  for (const LabelledFile& f : files) {
    const ImageInfo info = image_info(f.path);
    if (info.channels >= 3) common.channels = 3;
    if (first.empty()) {
      first = f.path;
      common.width = info.width;
      common.height = info.height;
      continue;
    }
    KILN_CHECK(size > 0 || (info.width == common.width && info.height == common.height),
               "{}: {}x{} pixels but {} is {}x{}: images of mixed sizes need --image-size", f.path,
               info.width, info.height, first, common.width, common.height);
  }
  if (common.channels == 0) common.channels = 1;
  if (size > 0) common.width = common.height = static_cast<int>(size);
  return common;
}

RawImages decode_all(const std::vector<LabelledFile>& files, const ImageInfo& format,
                     std::int64_t size, const std::vector<std::string>& classes) {
  const auto n = static_cast<std::int64_t>(files.size());
  RawImages out{Tensor::empty({n, format.channels, format.height, format.width}, DType::u8),
                Tensor::empty({n}, DType::i64), classes};
  const std::int64_t per_image = out.pixels.numel() / std::max<std::int64_t>(n, 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const Tensor image =
        decode_image(files[static_cast<std::size_t>(i)].path, format.channels, size);
    KILN_CHECK(image.numel() == per_image, "{}: decodes to {} but the set's images are {}x{}x{}",
               files[static_cast<std::size_t>(i)].path, image.shape().str(), format.channels,
               format.height, format.width);
    std::copy_n(image.data<std::uint8_t>(), per_image,
                out.pixels.data<std::uint8_t>() + i * per_image);
    out.labels.data<std::int64_t>()[i] = files[static_cast<std::size_t>(i)].label;
  }
  return out;
}

}  // namespace

Tensor decode_image(const std::string& path, int channels, std::int64_t size) {
  int w = 0, h = 0, stored = 0;
  const ImageInfo info = image_info(path);
  if (channels == 0) channels = info.channels >= 3 ? 3 : 1;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load(path.c_str(), &w, &h, &stored, channels), stbi_image_free);
  KILN_CHECK(pixels != nullptr, "{}: cannot decode the image ({})", path, stbi_failure_reason());
  const int out_w = size > 0 ? static_cast<int>(size) : w,
            out_h = size > 0 ? static_cast<int>(size) : h;
  std::vector<stbi_uc> interleaved(static_cast<std::size_t>(out_w) * out_h * channels);
  if (out_w == w && out_h == h)
    std::copy_n(pixels.get(), interleaved.size(), interleaved.begin());
  else
    KILN_CHECK(stbir_resize_uint8(pixels.get(), w, h, 0, interleaved.data(), out_w, out_h, 0,
                                  channels) != 0,
               "{}: resizing {}x{} to {}x{} failed", path, w, h, out_w, out_h);
  Tensor out = Tensor::empty({channels, out_h, out_w}, DType::u8);
  std::uint8_t* o = out.data<std::uint8_t>();
  const std::int64_t plane = static_cast<std::int64_t>(out_w) * out_h;
  for (std::int64_t p = 0; p < plane; ++p)
    for (int c = 0; c < channels; ++c)
      o[c * plane + p] = interleaved[static_cast<std::size_t>(p * channels + c)];
  return out;
}

RawSplits load_image_folder(const std::string& dir, const FolderOptions& options) {
  KILN_CHECK(fs::is_directory(dir), "image folder '{}' does not exist", dir);
  const fs::path root(dir);
  const bool has_splits = fs::is_directory(root / "train") && fs::is_directory(root / "test");
  const fs::path train_dir = has_splits ? root / "train" : root;
  const std::vector<std::string> classes = sorted_subfolders(train_dir);
  KILN_CHECK(classes.size() >= 2, "{}: {} class folders; a classifier needs at least 2",
             train_dir.string(), classes.size());
  std::vector<LabelledFile> train, test;
  if (has_splits) {
    train = labelled_files(train_dir, classes);
    test = labelled_files(root / "test", classes);
  } else {
    split_files(labelled_files(root, classes), static_cast<std::int64_t>(classes.size()), options,
                train, test);
  }
  KILN_CHECK(!test.empty(), "{}: no test images (add a test/ folder or raise --test-fraction)",
             dir);
  std::vector<LabelledFile> all = train;
  all.insert(all.end(), test.begin(), test.end());
  const ImageInfo format = common_format(all, options.image_size);
  const std::int64_t size = options.image_size;
  return {decode_all(train, format, size, classes), decode_all(test, format, size, classes)};
}

}  // namespace kiln
