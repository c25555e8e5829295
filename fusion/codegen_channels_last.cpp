// The body of a group with channels-last outputs (FusedGroup::channels_last): over [B, C, H, W],
// its elements taken a tile of 64 pixels (of the B H W, in NCHW order) x 64 channels at a time.
// Phase one reads the inputs along each channel's pixels (8 adjacent pixels a thread, one 16-byte
// load of each input, where every pointer is 16-byte aligned, H W and C are multiples of 8 and
// the inputs take 8 lanes; else one element a thread), computes, stores the [B, C, H, W] outputs
// as the elementwise body does and puts each channels-last one's values in a tile in shared
// memory; phase two stores the tile's rows of 64 channels, 16 bytes a thread. A tile row is 128
// bytes, its 16-byte chunks swizzled by the row's eighth so that neither phase's threads meet
// in a bank.
#include <fmt/format.h>

#include "fusion/codegen_writer.h"

namespace kiln::codegen {
namespace {

constexpr int kTile = 64;  // pixels and channels of a tile

// The tile element of pixel row `r`, channel `c` (C expressions of the tile's coordinates).
std::string swizzled(const std::string& r, const std::string& c) {
  return fmt::format("({0}) * {1} + ((((({2}) >> 3) ^ ((({0}) >> 3) & 7)) << 3) | (({2}) & 7))", r,
                     kTile, c);
}

}  // namespace

std::string Writer::channels_last_body(CudaKernelSource& k) const {
  const Shape& s = g_.shape;
  const std::int64_t channels = s[1], plane = s[2] * s[3], pixels = s[0] * plane;
  const std::int64_t pixel_tiles = (pixels + kTile - 1) / kTile,
                     channel_tiles = (channels + kTile - 1) / kTile;
  k.work_items = pixel_tiles * channel_tiles * 256;  // a block of 256 a tile
  k.vector_width = 1;
  bool wide = g_.low_precision() && lanes_ == 8 && plane % 8 == 0 && channels % 8 == 0;
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    wide =
        wide && (!g_.output_channels_last(o) || dtype_size(g_.operand_dtype(g_.outputs[o])) == 2);

  std::string out = fmt::format(
      "  const long long C = {}LL, P = {}LL, BP = {}LL, tiles = {}LL, channel_tiles = {}LL;\n",
      channels, plane, pixels, pixel_tiles * channel_tiles, channel_tiles);
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    if (g_.output_channels_last(o))
      out += fmt::format("  __shared__ __align__(16) {} tile{}[{}];\n",
                         storage_name(g_.operand_dtype(g_.outputs[o])), o, kTile * kTile);
  out += hoisted_scalars();
  // The tile loop, the same for every thread of a block (its barriers).
  const std::string tile_loop = fmt::format(
      "  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {{\n"
      "    const long long q0 = t / channel_tiles * {0}, c0 = t % channel_tiles * {0};\n",
      kTile);
  // Phase two: each channels-last output's tile rows, `lanes` channels a thread.
  auto store_rows = [&](bool vectors) {
    std::string text = "    __syncthreads();\n";
    const int lanes = vectors ? 8 : 1;
    text += fmt::format(
        "    for (int j = threadIdx.x; j < {0}; j += blockDim.x) {{\n"
        "      const int r = j / {1}, c = j % {1} * {2};\n"
        "      const long long q = q0 + r, ch = c0 + c;\n"
        "      if (q >= BP || ch >= C) continue;\n",
        kTile * kTile / lanes, kTile / lanes, lanes);
    for (std::size_t o = 0; o < g_.outputs.size(); ++o) {
      if (!g_.output_channels_last(o)) continue;
      if (vectors)
        text += fmt::format(
            "      *reinterpret_cast<uint4*>(out{0} + q * C + ch) = "
            "*reinterpret_cast<const uint4*>(tile{0} + {1});\n",
            o, swizzled("r", "c"));
      else
        text += fmt::format("      out{0}[q * C + ch] = tile{0}[{1}];\n", o, swizzled("r", "c"));
    }
    text += "    }\n    __syncthreads();\n  }\n";
    return text;
  };

  if (wide) {  // phase one: 8 pixels of one channel a thread, a warp 4 channels x 64 pixels
    out += "  if (" + aligned() + ") {\n" + tile_loop;
    out += fmt::format(
        "    for (int j = threadIdx.x; j < {0}; j += blockDim.x) {{\n"
        "      const int c = j / {1}, r = j % {1} * 8;\n"
        "      const long long q = q0 + r, ch = c0 + c;\n"
        "      if (q >= BP || ch >= C) continue;\n"
        "      const long long i = (q / P * C + ch) * P + q % P;\n",
        kTile * kTile / 8, kTile / 8);
    out += vector_body_wide({}, {}, [&](std::size_t o) {
      std::string lines;
      for (int lane = 0; lane < 8; ++lane)
        lines += fmt::format("      tile{}[{}] = o{}[{}];\n", o,
                             swizzled(fmt::format("r + {}", lane), "c"), o, lane);
      return lines;
    });
    out += "    }\n" + store_rows(true) + "  return;\n  }\n";
  }
  // One element a thread (any shape and alignment), a warp 32 pixels of one channel.
  out += tile_loop;
  out += fmt::format(
      "    for (int j = threadIdx.x; j < {0}; j += blockDim.x) {{\n"
      "      const int c = j / {1}, r = j % {1};\n"
      "      const long long q = q0 + r, ch = c0 + c;\n"
      "      if (q >= BP || ch >= C) continue;\n"
      "      const long long i = (q / P * C + ch) * P + q % P;\n",
      kTile * kTile, kTile);
  out += scalar_loads("      ", "i");
  out += compute("      ", "");
  for (std::size_t o = 0; o < g_.outputs.size(); ++o)
    out += "      " + store(o,
                            g_.output_channels_last(o)
                                ? fmt::format("tile{}[{}]", o, swizzled("r", "c"))
                                : fmt::format("out{}[i]", o),
                            "");
  out += "    }\n" + store_rows(false);
  return out;
}

}  // namespace kiln::codegen
