#include "backends/cuda/warm_up.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <exception>
#include <mutex>

#include "backends/cuda/cublas_handle.h"
#include "backends/cuda/matmul.h"

namespace kiln::cuda {
namespace {

struct Running {
  std::mutex mutex;
  std::condition_variable done;
  int count = 0;
};
Running& running() {
  static Running r;
  return r;
}

void warm_up_device(int device) noexcept {
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

}  // namespace

void warm_up_started() {
  Running& r = running();
  const std::lock_guard<std::mutex> lock(r.mutex);
  ++r.count;
}

void warm_up_ended() noexcept {
  Running& r = running();
  {
    const std::lock_guard<std::mutex> lock(r.mutex);
    --r.count;
  }
  r.done.notify_all();
}

void warm_up(int device) noexcept {
  warm_up_device(device);
  release_thread_handles();
  warm_up_ended();
}

void wait_for_warm_ups() {
  Running& r = running();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.done.wait(lock, [&r] { return r.count == 0; });
}

}  // namespace kiln::cuda
