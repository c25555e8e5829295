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
  const DeviceKernel& k =
      device_kernel(conv_mma_name(dtype, vec_a), [&] { return conv_mma_source(dtype, vec_a); });
  ConvGemmShape s = shape;
  void* args[] = {&w, &x, &y, &s};
  const auto tiles = [](int n) {
    return static_cast<unsigned>((n + kConvMmaTile - 1) / kConvMmaTile);
  };
  k.kernel.launch({tiles(shape.n), tiles(shape.m), 1}, {kConvMmaThreads, 1, 1}, 0, stream, args);
}

}  // namespace kiln::cuda
