// conv2d_bias's epilogue (conv_cpu.h's ConvEpilogue) over one output channel's values, for the
// CPU kernels (OpenMP simd loops: not for the CUDA backend's host files).
#pragma once

#include "graph/kernels/conv_cpu.h"

namespace kiln::kernels {

// Applies the epilogue to one output channel's n values in place.
template <class T>
inline void apply_conv_epilogue(T* values, std::int64_t n, const ConvEpilogue& e,
                                std::int64_t channel) {
  const T b = e.bias != nullptr ? e.bias->data<T>()[channel] : T(0);
  if (e.bias != nullptr && e.relu) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const T v = values[i] + b;
      values[i] = v > T(0) ? v : T(0);
    }
  } else if (e.bias != nullptr) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) values[i] += b;
  } else if (e.relu) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) values[i] = values[i] > T(0) ? values[i] : T(0);
  }
}

}  // namespace kiln::kernels
