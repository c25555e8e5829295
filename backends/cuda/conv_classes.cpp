// The input gradient's taps by classes of dx's pixels, and its plan on the TMA pass
// (conv_passes.h, conv.h).
#include <cstdlib>
#include <optional>
#include <string>

#include "backends/cuda/conv.h"
#include "backends/cuda/conv_passes.h"
#include "backends/cuda/conv_tma.h"
#include "core/env_switch.h"
#include "core/error.h"

namespace kiln::cuda {

ConvClasses conv_input_gradient_classes(const kernels::ConvGeometry& g, bool by_residue) {
  KILN_CHECK(!by_residue || (g.stride >= 1 && g.stride <= 2),
             "conv2d_grad_input: classes of dx's pixels by a stride of {} (1 or 2)", g.stride);
  const int s = by_residue ? static_cast<int>(g.stride) : 1, p = static_cast<int>(g.padding);
  ConvClasses cl{};
  cl.count = s * s;
  cl.stride = s;
  cl.kernel_w = static_cast<int>(g.kernel_w);
  cl.plane = static_cast<int>(g.height * g.width);
  cl.row_pitch = s * static_cast<int>(g.width);
  // Along one side: the residue r's first tap (the flipped filter's last), its taps, and the
  // shift of dy's window (dy's row a + j - pad for the class's row a and its j-th tap).
  struct Side {
    int first, taps, pad;
  };
  auto side = [&](int r, int kernel) -> Side {
    if (s == 1) return {0, kernel, kernel - 1 - p};
    const int first = (r + p) % s;
    const int taps = first < kernel ? (kernel - first + s - 1) / s : 0;
    return {first, taps, taps - 1 - (r + p - first) / s};
  };
  for (int rh = 0; rh < s; ++rh)
    for (int rw = 0; rw < s; ++rw) {
      const int c = rh * s + rw;
      const Side h = side(rh, static_cast<int>(g.kernel_h)),
                 w = side(rw, static_cast<int>(g.kernel_w));
      const bool any = h.taps > 0 && w.taps > 0;
      cl.taps_h[c] = any ? h.taps : 0;
      cl.taps_w[c] = any ? w.taps : 0;
      cl.first_kh[c] = h.first;
      cl.first_kw[c] = w.first;
      cl.pad_h[c] = h.pad;
      cl.pad_w[c] = w.pad;
      cl.out_offset[c] = rh * static_cast<int>(g.width) + rw;
    }
  return cl;
}

namespace conv_detail {

std::optional<TmaGradInput> tma_grad_input(const ConvGeometry& g, DType dtype) {
  static const bool classes_allowed = env_switch_on("KILN_CONV_CLASSES");
  const GemmDims d = dims_of(g, ConvPass::grad_input);
  ConvGemmShape shape = gemm_shape(g, ConvPass::grad_input, d, d.k);
  if (g.stride == 1) {
    const std::optional<TmaTile> tile = conv_tma_tile(dtype, shape, false);
    if (!tile) return std::nullopt;
    return TmaGradInput{shape, *tile, conv_input_gradient_classes(g, false)};
  }
  if (!classes_allowed || g.stride != 2 || g.height % 2 != 0 || g.width % 4 != 0 ||
      dtype == DType::f32)  // (the classes' paired stores are 16-bit: TF32 keeps the dilated pass)
    return std::nullopt;
  shape.s_w /= 2;
  shape.s_hw /= 4;
  shape.n /= 4;
  shape.c_ms = shape.s_hw;
  shape.pad_h = shape.pad_w = 0;  // each class's own
  std::optional<TmaTile> tile = conv_tma_tile(dtype, shape, false);
  if (!tile) return std::nullopt;
  // K whole, and 128 pixels where they fit (the kernel holds half a class pair's sums besides)
  const int bn = tile->bn == 256 && conv_tma_box(shape, 128) ? 128 : tile->bn;
  if (tile->split > 1 || bn != tile->bn || tile->halo())  // (the halo form: one class)
    tile = conv_tma_tile_of(tile->bm, bn, tile->bm == 64 ? tile->teams : 1);
  return TmaGradInput{shape, *tile, conv_input_gradient_classes(g, true)};
}

}  // namespace conv_detail

}  // namespace kiln::cuda
