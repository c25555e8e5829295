// cuBLAS handles, one per (device, thread), bound to the caller's stream at each use;
// KILN_CUBLAS_CHECK; and the process-wide switch that lets f32 GEMMs use TF32 tensor cores.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// The calling thread's handle for the current device, created on first use, with its
// stream set to `stream`. A handle is not shared between threads, so concurrent callers
// never race on its stream; it is destroyed when its thread exits.
cublasHandle_t handle_for(gpu::Stream stream);
// Destroys the calling thread's handles now rather than at its exit (the warm-up thread's, so
// that none is destroyed while a program's GEMMs run).
void release_thread_handles();

// TF32 for f32 GEMMs (10-bit mantissa inputs, about 8x faster on Hopper). Off by default:
// f32 results then match the CPU to about 1e-6 relative. Read at each GEMM call.
void set_allow_tf32(bool allow);
bool allow_tf32();

// "CUBLAS_STATUS_INVALID_VALUE", ... for messages.
const char* cublas_status_name(cublasStatus_t status);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);

}  // namespace kiln::cuda

// A failed cuBLAS call throws kiln::Error with the call's text, file:line and the status name.
#define KILN_CUBLAS_CHECK(expr)                                                         \
  do {                                                                                  \
    const cublasStatus_t kiln_cublas_status_ = (expr);                                  \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::kiln::cuda::throw_cublas_error(kiln_cublas_status_, #expr, __FILE__, __LINE__); \
  } while (0)
