// PNG sample grids: the layout of tiles, encoding and the atomic write, checked by decoding
// the file with stb_image.
#include <doctest/doctest.h>

#include <stb/stb_image.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "train/png_grid.h"
#include "tests/support.h"

namespace kiln {
namespace {

struct Decoded {
  int width = 0, height = 0;
  std::vector<std::uint8_t> pixels;
};

Decoded decode(const std::vector<std::uint8_t>& png) {
  Decoded d;
  int channels = 0;
  stbi_uc* data = stbi_load_from_memory(png.data(), static_cast<int>(png.size()), &d.width,
                                        &d.height, &channels, 1);
  REQUIRE(data != nullptr);
  CHECK(channels == 1);
  d.pixels.assign(data, data + static_cast<std::ptrdiff_t>(d.width) * d.height);
  stbi_image_free(data);
  return d;
}

// The pixel (x, y) of the grid as the layout defines it, from the images directly.
int expected_pixel(const Tensor& images, std::int64_t columns, std::int64_t x, std::int64_t y) {
  const std::int64_t h = images.shape()[2], w = images.shape()[3], p = kGridPadding;
  const std::int64_t col = (x - p) / (w + p), row = (y - p) / (h + p);
  const std::int64_t tx = (x - p) % (w + p), ty = (y - p) % (h + p);
  if (x < p || y < p || tx >= w || ty >= h) return 0;
  const std::int64_t i = row * columns + col;
  if (i >= images.shape()[0]) return 0;
  const double v = std::clamp(images.at((i * h + ty) * w + tx), -1.0, 1.0);
  return static_cast<int>(std::lround((v + 1.0) / 2.0 * 255.0));
}

}  // namespace

TEST_CASE(
    "a PNG grid decodes to the tiles of the images, padded, with values mapped from [-1, 1]") {
  Tensor images =
      test::random_tensor({5, 1, 4, 6}, DType::f32, 3, -1.2, 1.2);  // values beyond [-1, 1] clamp
  images.data<float>()[0] = -1.0f;
  images.data<float>()[1] = 1.0f;
  const Decoded d = decode(encode_png_grid(images, 2));
  REQUIRE(d.width == 2 * (6 + kGridPadding) + kGridPadding);
  REQUIRE(d.height == 3 * (4 + kGridPadding) + kGridPadding);
  CHECK(d.pixels[static_cast<std::size_t>(kGridPadding * d.width + kGridPadding)] == 0);
  CHECK(d.pixels[static_cast<std::size_t>(kGridPadding * d.width + kGridPadding + 1)] == 255);
  int mismatches = 0;
  for (int y = 0; y < d.height; ++y)
    for (int x = 0; x < d.width; ++x)
      mismatches +=
          d.pixels[static_cast<std::size_t>(y * d.width + x)] != expected_pixel(images, 2, x, y);
  CHECK(mismatches == 0);
}

TEST_CASE("write_png_grid writes the file atomically and it decodes to the same grid") {
  const test::TempDir scratch("kiln-png-grid-test");
  const std::filesystem::path& dir = scratch.path;
  const Tensor images = test::random_tensor({64, 1, 28, 28}, DType::f32, 5);
  const std::filesystem::path path = dir / "grid.png";
  write_png_grid(path, images, 8);
  std::ifstream in(path, std::ios::binary);
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                        std::istreambuf_iterator<char>());
  CHECK(bytes == encode_png_grid(images, 8));
  const Decoded d = decode(bytes);
  CHECK(d.width == 8 * 30 + 2);
  CHECK(d.height == 8 * 30 + 2);
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    CHECK(entry.path().filename() == "grid.png");  // no temp left
}

TEST_CASE("PNG grids reject images that are not [N, 1, H, W] and unwritable paths, naming them") {
  CHECK_THROWS_WITH_AS(encode_png_grid(Tensor::zeros({4, 3, 8, 8}, DType::f32), 2),
                       doctest::Contains("[N, 1, H, W]"), Error);
  CHECK_THROWS_WITH_AS(encode_png_grid(Tensor::zeros({4, 1, 8, 8}, DType::f32), 0),
                       doctest::Contains("columns must be at least 1"), Error);
  CHECK_THROWS_WITH_AS(
      write_png_grid("/nonexistent-dir/grid.png", Tensor::zeros({1, 1, 8, 8}, DType::f32), 1),
      doctest::Contains("/nonexistent-dir/grid.png"), Error);
}

}  // namespace kiln
