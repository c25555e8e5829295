// Per-(device, thread) cuBLAS handles: cublasCreate is slow (it allocates), and a handle
// must not be used by two threads at once, so each thread keeps its own per device.
#include "backends/cuda/cublas_handle.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>

#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

std::atomic<bool> tf32_allowed{false};

// The handles of one thread, destroyed at thread exit (errors then are ignored: the CUDA
// runtime may already be shutting down at process exit).
class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() { clear(); }
  void clear() {
    for (auto& [device, handle] : handles_) (void)cublasDestroy(handle);
    handles_.clear();
  }
  cublasHandle_t get(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasHandle_t handle = nullptr;
    KILN_CUBLAS_CHECK(cublasCreate(&handle));
    handles_.emplace(device, handle);
    return handle;
  }

 private:
  std::map<int, cublasHandle_t> handles_;
};

ThreadHandles& thread_handles() {
  thread_local ThreadHandles handles;
  return handles;
}

}  // namespace

cublasHandle_t handle_for(gpu::Stream stream) {
  ThreadHandles& handles = thread_handles();
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  cublasHandle_t handle = handles.get(device);
  KILN_CUBLAS_CHECK(cublasSetStream(handle, stream));
  return handle;
}

void release_thread_handles() { thread_handles().clear(); }

void set_allow_tf32(bool allow) { tf32_allowed.store(allow, std::memory_order_relaxed); }
bool allow_tf32() { return tf32_allowed.load(std::memory_order_relaxed); }

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // a failed launch inside cuBLAS may leave a non-sticky error behind
  throw Error(fmt::format("cuBLAS error {} ({}) in `{}` at {}:{}", cublas_status_name(status),
                          cublasGetStatusString(status), call, file, line));
}

}  // namespace kiln::cuda
