// The implicit-GEMM kernel's launch (conv_igemm.h).
#include "backends/cuda/conv_igemm.h"

#include "backends/cuda/kernel_registry.h"

namespace kiln::cuda {

void conv_igemm_launch(IgemmMode mode, DType dtype, IgemmTile tile, const ConvGemmShape& shape,
                       std::int64_t splits, const void* a, const void* img, void* target,
                       gpu::Stream stream) {
  const bool float_out = splits > 1 && is_low_precision(dtype);  // f32 partials
  const DeviceKernel& k = device_kernel(conv_igemm_name(mode, tile, dtype, float_out), [&] {
    return conv_igemm_source(mode, tile, dtype, float_out);
  });
  ConvGemmShape s = shape;
  void* args[] = {&a, &img, &target, &s};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + tile.bn - 1) / tile.bn),
                       static_cast<unsigned>((shape.m + tile.bm - 1) / tile.bm),
                       static_cast<unsigned>(splits)};
  k.kernel.launch(grid, {static_cast<unsigned>(igemm_threads(tile)), 1, 1}, 0, stream, args);
}

}  // namespace kiln::cuda
