// Tiling and PNG encoding of sample grids.
#include "train/png_grid.h"

#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>

#include "core/atomic_file.h"

namespace kiln {
namespace {

void append_bytes(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<std::uint8_t>*>(context);
  const auto* bytes = static_cast<const std::uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

std::uint8_t to_byte(float x) {
  const float unit =
      std::clamp((x + 1.0f) * 0.5f, 0.0f, 1.0f);  // NaN passes clamp; it is drawn black
  return std::isnan(unit) ? 0 : static_cast<std::uint8_t>(std::lround(unit * 255.0f));
}

}  // namespace

std::vector<std::uint8_t> grid_pixels(const Tensor& images, std::int64_t columns,
                                      std::int64_t* width, std::int64_t* height) {
  const Shape& s = images.shape();
  KILN_CHECK(s.rank() == 4 && s[1] == 1 && s[0] >= 1 && images.dtype() == DType::f32,
             "png grid: images must be f32 [N, 1, H, W] with N >= 1 but are {}{}",
             dtype_name(images.dtype()), s.str());
  KILN_CHECK(columns >= 1, "png grid: columns must be at least 1 (got {})", columns);
  images.check_host("png grid");
  const std::int64_t n = s[0], h = s[2], w = s[3], p = kGridPadding;
  const std::int64_t cols = std::min(columns, n), rows = (n + cols - 1) / cols;
  *width = cols * (w + p) + p;
  *height = rows * (h + p) + p;
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(*width * *height), 0);
  const float* src = images.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t top = p + (i / cols) * (h + p), left = p + (i % cols) * (w + p);
    for (std::int64_t y = 0; y < h; ++y)
      for (std::int64_t x = 0; x < w; ++x)
        pixels[static_cast<std::size_t>((top + y) * *width + left + x)] =
            to_byte(src[(i * h + y) * w + x]);
  }
  return pixels;
}

std::vector<std::uint8_t> encode_png_grid(const Tensor& images, std::int64_t columns) {
  std::int64_t width = 0, height = 0;
  const std::vector<std::uint8_t> pixels = grid_pixels(images, columns, &width, &height);
  KILN_CHECK(width < (1 << 20) && height < (1 << 20), "png grid: {}x{} pixels is too large", width,
             height);
  std::vector<std::uint8_t> png;
  const int ok =
      stbi_write_png_to_func(append_bytes, &png, static_cast<int>(width), static_cast<int>(height),
                             1, pixels.data(), static_cast<int>(width));
  KILN_CHECK(ok != 0 && !png.empty(), "png grid: stb_image_write failed to encode {}x{} pixels",
             width, height);
  return png;
}

void write_png_grid(const std::filesystem::path& path, const Tensor& images, std::int64_t columns) {
  const std::vector<std::uint8_t> png = encode_png_grid(images, columns);
  write_file_atomically(path, png);
}

}  // namespace kiln
