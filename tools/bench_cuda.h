// GPU-only benchmarks for `bench`: a fused kernel timed with CUDA events on device data.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/dtype.h"

namespace kiln::tools {

// tanh(relu(a * b + 1)) * 0.5 over n values of `dtype` (f32, bf16 or f16) as one fused kernel:
// CUDA events around `steps` launches after `warmup`; reports the median time and TB/s
// counting 2 reads + 1 write.
nlohmann::json bench_fused_chain_cuda(std::int64_t n, int warmup, int steps, DType dtype);

// The caching allocator's peak of bytes in use since the last reset (what kiln's tensors,
// arenas and staging hold; cuBLAS's own workspace is not counted).
void reset_device_peak();
// Forces the convolution algorithm of the next programs: "auto", "im2col" (im2col + cuBLAS
// everywhere) or "im2col-grad-weight" (only for weight gradients); kiln::Error otherwise.
void force_conv_algo(const std::string& name);
// Creates the CUDA context (cudaFree(0)) and returns how long it took, in milliseconds.
double cuda_context_ms();
std::size_t device_peak_bytes();

}  // namespace kiln::tools
