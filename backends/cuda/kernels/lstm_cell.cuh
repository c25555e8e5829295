// What the LSTM kernels share (lstm_step.cuh, lstm_persistent.cuh): a 4-element vector of T
// for aligned 128-bit (f32) or 2x128-bit (f64) accesses, the gate nonlinearities and the
// forward cell.
#pragma once

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
// c_prev: writes the activations (acts, [rows, 4H]), c and h ([rows, H]); returns c.
template <typename T>
__device__ __forceinline__ T lstm_cell(const T (&gate)[4], T c_prev, long long row, int j,
                                       int hidden, T* acts, T* cs, T* hs) {
  const T i = lstm_sigmoid(gate[0]), f = lstm_sigmoid(gate[1]), g = lstm_tanh(gate[2]),
          o = lstm_sigmoid(gate[3]);
  const T c = f * c_prev + i * g;
  T* a = acts + row * 4 * hidden + j;
  a[0] = i;
  a[hidden] = f;
  a[2 * hidden] = g;
  a[3 * hidden] = o;
  cs[row * hidden + j] = c;
  hs[row * hidden + j] = o * lstm_tanh(c);
  return c;
}

}  // namespace kiln::cuda
