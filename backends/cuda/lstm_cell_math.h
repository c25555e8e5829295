// CUDA C shared by the LSTM kernels (lstm_kernels.cpp, lstm_persistent_kernels.cpp): a
// 4-element vector of T for aligned 128-bit (f32) or 2x128-bit (f64) accesses, and the
// gate nonlinearities. T is typedef'd by the including source.
#pragma once

namespace kiln::cuda {

inline constexpr const char* kLstmCellMath = R"(
struct __align__(4 * sizeof(T)) Quad { T v[4]; };
__device__ __forceinline__ float lstm_exp(float x) { return expf(x); }
__device__ __forceinline__ double lstm_exp(double x) { return exp(x); }
__device__ __forceinline__ float lstm_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double lstm_tanh(double x) { return tanh(x); }
__device__ __forceinline__ T lstm_sigmoid(T x) { return T(1) / (T(1) + lstm_exp(-x)); }
)";

}  // namespace kiln::cuda
