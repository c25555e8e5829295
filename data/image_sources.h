// Image datasets from files, chosen by one spec (--data): Fashion-MNIST's IDX files, the
// binary releases of CIFAR-10 and CIFAR-100, and folders of images (one subfolder a class).
// Sources load raw u8 pixels with their class names; data/normalise.h turns them into the
// f32 datasets the models train on.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Pixels as the files hold them, with labels and the class names.
struct RawImages {
  Tensor pixels;  // u8 [N, C, H, W]
  Tensor labels;  // i64 [N], in [0, classes.size())
  std::vector<std::string> classes;
  std::int64_t size() const { return labels.numel(); }
};

struct RawSplits {
  RawImages train, test;
};

// What --data names: "fashion-mnist[:DIR]", "cifar10:DIR", "cifar100:DIR", "folder:DIR" or
// "synthetic[:CxHxW]".
struct DataSource {
  std::string kind;                           // fashion-mnist, cifar10, cifar100, folder, synthetic
  std::string dir;                            // empty for fashion-mnist: the default directory
  std::vector<std::int64_t> synthetic_shape;  // synthetic: [C, H, W], empty: the model's
};

// kiln::Error naming the spec and the accepted forms for anything else.
DataSource parse_data_source(const std::string& spec);
// "3x32x32" -> {3, 32, 32}; kiln::Error naming `where` unless three sizes in [1, 4096].
std::vector<std::int64_t> parse_image_shape(const std::string& text, const std::string& where);

struct FolderOptions {
  std::int64_t image_size = 0;  // > 0: every image resized to image_size x image_size
  double test_fraction = 0.1;   // a folder without train/ and test/: this share is the test set
  std::uint64_t seed = 0;       // ... drawn with this seed
};

// CIFAR-10: DIR/data_batch_{1..5}.bin (train) and DIR/test_batch.bin, records of a label
// byte and 3072 pixel bytes; class names from DIR/batches.meta.txt when present.
RawSplits load_cifar10(const std::string& dir);
// CIFAR-100: DIR/train.bin and DIR/test.bin, records of a coarse and a fine label byte and
// 3072 pixel bytes; trains on the fine labels; names from DIR/fine_label_names.txt if any.
RawSplits load_cifar100(const std::string& dir);
// Both CIFAR files' coarse labels (CIFAR-100's 20 superclasses), for inspection and tests.
Tensor load_cifar100_coarse_labels(const std::string& path);

// DIR/train/<class>/*.{png,jpg,jpeg,bmp} and DIR/test/<class>/..., or DIR/<class>/... split
// by options.test_fraction. Classes are the subfolder names in sorted order. kiln::Error
// naming the file for one that does not decode, a class folder with no images, a test class
// that training lacks, or sizes (or channel counts) that differ without an image_size.
RawSplits load_image_folder(const std::string& dir, const FolderOptions& options);

// One image file decoded (PNG, JPEG, BMP, ...) to u8 [C, H, W] with `channels` channels
// (0: as stored, grey 1 or colour 3; an alpha channel is dropped), resized to size x size
// when size > 0. kiln::Error naming the file if it cannot be read or decoded.
Tensor decode_image(const std::string& path, int channels = 0, std::int64_t size = 0);

}  // namespace kiln
