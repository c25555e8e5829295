// TF32's tap columns for the weight gradient's TMA pass (conv_tma.h; kernels/tap_expand.cuh):
// their bytes, the kernel's source and its launch.
#include <cstdint>

#include "backends/cuda/conv_tma.h"
#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"
#include "core/error.h"
#include "kiln_kernel_files.h"

namespace kiln::cuda {

std::size_t tf32_tap_expand_bytes(const ConvGemmShape& g) {
  return static_cast<std::size_t>(g.k / g.s_hw) * static_cast<std::size_t>(g.n / g.khkw) *
         static_cast<std::size_t>(tf32_tap_columns(g) * tf32_tap_rows(g) * g.s_w) * 4;
}

gpu::KernelSource tap_expand_source() {
  return embedded_kernel("kiln_tap_expand_b4", kernel_files::tap_expand_cuh, "KILN_TAP_EXPAND", {});
}

void tf32_tap_expand(const ConvGemmShape& g, const void* x, void* x3, gpu::Stream stream) {
  KILN_CHECK(g.s_w % 4 == 0 && reinterpret_cast<std::uintptr_t>(x3) % 16 == 0 &&
                 tf32_tap_expand_bytes(g) / 16 < (std::size_t{1} << 31),
             "conv2d_grad_weight (TMA, TF32): tap columns of rows of {} (a multiple of 4), "
             "16-byte aligned, under 2^31 quads",
             g.s_w);
  const DeviceKernel& k = device_kernel("kiln_tap_expand_b4", [] { return tap_expand_source(); });
  int planes = (g.k / g.s_hw) * (g.n / g.khkw), h = g.img_h, w = g.img_w, ow = g.s_w, kw = g.kw,
      pad = g.pad_w, stride = g.stride, rows = tf32_tap_rows(g), row0 = (h - rows) / 2,
      skip = tf32_centre_from_x(g) ? g.pad_w : -1;
  const std::int64_t items =
      static_cast<std::int64_t>(planes) * tf32_tap_columns(g) * rows * (ow / 4);
  if (items == 0) return;  // (a 1x1: its one tap is x's own)
  const void* source = x;
  void* args[] = {&source, &x3, &planes, &h, &w, &ow, &kw, &pad, &stride, &rows, &row0, &skip};
  launch_items(k, items, stream, args);
}

}  // namespace kiln::cuda
