#include "backends/cuda/warm_up.h"

#include <cuda_runtime_api.h>

#include <exception>

#include "backends/cuda/matmul.h"

namespace kiln::cuda {

void warm_up(int device) noexcept {
  if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  cudaStream_t stream = nullptr;
  float* buffer = nullptr;
  constexpr int kSide = 16;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
      cudaMalloc(reinterpret_cast<void**>(&buffer), 3 * kSide * kSide * sizeof(float)) ==
          cudaSuccess &&
      cudaMemsetAsync(buffer, 0, 2 * kSide * kSide * sizeof(float), stream) == cudaSuccess) {
    try {
      matmul({.m = kSide,
              .n = kSide,
              .k = kSide,
              .a = buffer,
              .b = buffer + kSide * kSide,
              .c = buffer + 2 * kSide * kSide},
             stream);
      (void)cudaStreamSynchronize(stream);
    } catch (const std::exception&) {  // the program's own first GEMM reports it
    }
  }
  if (buffer != nullptr) (void)cudaFree(buffer);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
}

}  // namespace kiln::cuda
