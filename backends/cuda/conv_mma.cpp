// The launch of the tensor-core convolution forward (conv_mma.h, kernels/conv_mma.cuh).
#include "backends/cuda/conv_mma.h"

#include <cstdint>

#include "backends/cuda/kernel_registry.h"
#include "backends/cuda/kernel_sources.h"

namespace kiln::cuda {

void conv_mma_forward(DType dtype, const ConvGemmShape& shape, const void* w, const void* x,
                      void* y, gpu::Stream stream) {
  if (shape.m == 0 || shape.n == 0) return;
  const bool vec_a =
      conv_mma_vector_weights(shape.k) && reinterpret_cast<std::uintptr_t>(w) % 16 == 0;
  const int bm = conv_mma_tile_m(shape.m, shape.n);
  const DeviceKernel& k = device_kernel(conv_mma_name(dtype, bm, vec_a),
                                        [&] { return conv_mma_source(dtype, bm, vec_a); });
  ConvGemmShape s = shape;
  void* args[] = {&w, &x, &y, &s};
  const gpu::Dim3 grid{static_cast<unsigned>((shape.n + 63) / 64),
                       static_cast<unsigned>((shape.m + bm - 1) / bm), 1};
  k.kernel.launch(grid, {static_cast<unsigned>(2 * bm), 1, 1}, 0, stream, args);
}

}  // namespace kiln::cuda
