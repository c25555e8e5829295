// What the LSTM kernels share (lstm_step.cuh, lstm_persistent.cuh): a 4-element vector of T
// for aligned 128-bit (f32) or 2x128-bit (f64) accesses, the gate nonlinearities and the
// forward cell. The kernels store T (f32, f64, or the bf16/f16 storage types) and compute in
// W = Wide<T>::type: gates, sums and the carried c are float registers for bf16 and f16.
#pragma once

#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

template <typename T>
struct __align__(4 * sizeof(T)) Quad {
  T v[4];
};

__device__ __forceinline__ float lstm_exp(float x) { return expf(x); }
__device__ __forceinline__ double lstm_exp(double x) { return exp(x); }
__device__ __forceinline__ float lstm_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double lstm_tanh(double x) { return tanh(x); }
template <typename T>
__device__ __forceinline__ T lstm_sigmoid(T x) {
  return T(1) / (T(1) + lstm_exp(-x));
}

// The cell of (time-major row `row`, unit j) from its pre-activation gates [i, f, g, o] and
// c_prev: writes the activations (acts, [rows, 4H]), c and h ([rows, H]), each rounded to T
// once; returns c unrounded.
template <typename T, typename W>
__device__ __forceinline__ W lstm_cell(const W (&gate)[4], W c_prev, long long row, int j,
                                       int hidden, T* acts, T* cs, T* hs) {
  const W i = lstm_sigmoid(gate[0]), f = lstm_sigmoid(gate[1]), g = lstm_tanh(gate[2]),
          o = lstm_sigmoid(gate[3]);
  const W c = f * c_prev + i * g;
  T* a = acts + row * 4 * hidden + j;
  a[0] = T(i);
  a[hidden] = T(f);
  a[2 * hidden] = T(g);
  a[3 * hidden] = T(o);
  cs[row * hidden + j] = T(c);
  hs[row * hidden + j] = T(o * lstm_tanh(c));
  return c;
}

}  // namespace kiln::cuda
