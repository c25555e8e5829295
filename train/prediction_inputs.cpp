// What `trainer predict` feeds a saved classifier: the images of an IDX file or of image
// files, brought to the input it was trained on (resized, padded, normalised as in training).
#include <filesystem>

#include "data/idx.h"
#include "data/image_data.h"
#include "train/saved_classifier.h"

namespace kiln {
namespace {

// The size images have before training's --pad: the model's input less the border.
std::int64_t inner_size(const SavedClassifier& s, std::int64_t dim) {
  return s.example[dim] - 2 * s.config.images.pad;
}

Tensor idx_images(const std::string& path, const SavedClassifier& s) {
  const Tensor raw = read_idx(path);
  const Shape& r = raw.shape();
  KILN_CHECK(raw.dtype() == DType::u8 && r.rank() == 3 && r[0] >= 1,
             "{}: expected u8 images [N, H, W] but found {}{}", path, dtype_name(raw.dtype()),
             r.str());
  KILN_CHECK(s.example[0] == 1 && r[1] == inner_size(s, 1) && r[2] == inner_size(s, 2),
             "{}: images {}, but the model takes {} (grey {}x{} images before a border of {})",
             path, r.str(), s.example.str(), inner_size(s, 1), inner_size(s, 2),
             s.config.images.pad);
  return raw.reshape({r[0], 1, r[1], r[2]});
}

Tensor image_files(const std::vector<std::string>& paths, const SavedClassifier& s) {
  const std::int64_t h = inner_size(s, 1), w = inner_size(s, 2);
  const auto n = static_cast<std::int64_t>(paths.size());
  Tensor out = Tensor::empty({n, s.example[0], h, w}, DType::u8);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::string& path = paths[static_cast<std::size_t>(i)];
    KILN_CHECK(is_image_file(path), "{}: not a PNG, JPEG or BMP file (an IDX file comes alone)",
               path);
    Tensor image = decode_image(path, static_cast<int>(s.example[0]));
    if (image.shape()[1] != h || image.shape()[2] != w) {
      KILN_CHECK(h == w, "{}: {} but the model takes {}x{} images (only square sizes resize)", path,
                 image.shape().str(), h, w);
      image = decode_image(path, static_cast<int>(s.example[0]), h);
    }
    std::copy_n(image.data<std::uint8_t>(), image.numel(),
                out.data<std::uint8_t>() + i * image.numel());
  }
  return out;
}

}  // namespace

bool is_image_file(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
}

Tensor prediction_inputs(const std::vector<std::string>& paths, const SavedClassifier& s) {
  KILN_CHECK(!paths.empty(), "predict: no images given");
  const bool files = is_image_file(paths[0]);
  KILN_CHECK(files || paths.size() == 1, "{}: an IDX file comes alone, not with other files",
             paths[0]);
  const Tensor pixels = files ? image_files(paths, s) : idx_images(paths[0], s);
  return normalise(pad_images(pixels, s.config.images.pad), {s.mean, s.std});
}

}  // namespace kiln
