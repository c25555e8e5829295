// Sample grids for GANs: a batch of single-channel images in [-1, 1] tiled into one
// grayscale PNG (stb_image_write), written atomically.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/tensor.h"

namespace kiln {

inline constexpr std::int64_t kGridPadding = 2;  // black pixels between and around tiles

// 8-bit pixels of the grid: images [N, 1, H, W] (f32, values in [-1, 1], clamped) in rows of
// `columns` tiles, ceil(N / columns) rows, kGridPadding black pixels around each tile.
// Pixel value round((x + 1) / 2 * 255). Returns the pixels row-major; sets *width, *height.
std::vector<std::uint8_t> grid_pixels(const Tensor& images, std::int64_t columns,
                                      std::int64_t* width, std::int64_t* height);

// The grid as PNG bytes.
std::vector<std::uint8_t> encode_png_grid(const Tensor& images, std::int64_t columns);

// Writes the grid to `path` atomically (core/atomic_file.h); kiln::Error names the path.
void write_png_grid(const std::filesystem::path& path, const Tensor& images, std::int64_t columns);

}  // namespace kiln
