// KILN_CUDA_CHECK(expr): a failed CUDA runtime call throws kiln::Error with the call's text,
// file:line and CUDA's error name and text. Needs the CUDA toolkit (KILN_HAVE_CUDA).
#pragma once

#ifndef KILN_HAVE_CUDA
#error "gpu/cuda_check.h needs the CUDA toolkit; guard its use with #ifdef KILN_HAVE_CUDA"
#endif

#include <cuda_runtime_api.h>

#include <string>

namespace kiln::gpu {

// Throws kiln::Error for `status` (which is not cudaSuccess). `context` (may be empty) is
// prepended to the message, e.g. the kernel being launched.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line,
                                   const std::string& context = "");

}  // namespace kiln::gpu

#define KILN_CUDA_CHECK(expr)                                                      \
  do {                                                                             \
    const cudaError_t kiln_cuda_status_ = (expr);                                  \
    if (kiln_cuda_status_ != cudaSuccess)                                          \
      ::kiln::gpu::throw_cuda_error(kiln_cuda_status_, #expr, __FILE__, __LINE__); \
  } while (0)
