// layer_norm over the last axis and its gradient (graph/ops/reduce_ops.cpp has the CPU
// reference): one warp per row of D elements, 8 rows per block of 256 threads, rows
// grid-strided. Each lane sums its strided share of the row and the warp adds the shares
// with shuffles, so a row's sum has a fixed order. The host defines KILN_T and the entry it
// wants as the kernel's name (layer_norm.cpp). bf16/f16 rows are read as float and every
// sum, mean and rstd is float (Wide<T>); y (dx), mean and rstd are rounded where stored.
#pragma once

#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

inline constexpr int kLayerNormThreads = 256;

// The sum of every lane's v, on every lane.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// y = (x - mean) rstd per row; mean and rstd [rows] (rstd = 1 / sqrt(biased var + eps)).
template <typename T, typename W = typename Wide<T>::type>
__device__ __forceinline__ void layer_norm_forward(const T* __restrict__ x, T* __restrict__ y,
                                                   T* __restrict__ mean, T* __restrict__ rstd,
                                                   long long rows, int d, W eps) {
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const T* xr = x + r * d;
    W sum = W(0);
    for (int i = lane; i < d; i += 32) sum += xr[i];
    const W m = warp_sum(sum) / W(d);
    W squares = W(0);
    for (int i = lane; i < d; i += 32) squares += (W(xr[i]) - m) * (W(xr[i]) - m);
    const W s = W(1) / sqrt(warp_sum(squares) / W(d) + eps);
    for (int i = lane; i < d; i += 32) y[r * d + i] = T((W(xr[i]) - m) * s);
    if (lane == 0) {
      mean[r] = T(m);
      rstd[r] = T(s);
    }
  }
}

// dx = rstd (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) rstd.
template <typename T, typename W = typename Wide<T>::type>
__device__ __forceinline__ void layer_norm_backward(const T* __restrict__ dy,
                                                    const T* __restrict__ x,
                                                    const T* __restrict__ mean,
                                                    const T* __restrict__ rstd, T* __restrict__ dx,
                                                    long long rows, int d) {
  const int lane = threadIdx.x & 31;
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long r = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    const T *g = dy + r * d, *xr = x + r * d;
    const W m = mean[r], s = rstd[r];
    W sum_g = W(0), sum_gx = W(0);
    for (int i = lane; i < d; i += 32) {
      sum_g += g[i];
      sum_gx += W(g[i]) * (W(xr[i]) - m) * s;
    }
    const W a = warp_sum(sum_g) / W(d), b = warp_sum(sum_gx) / W(d);
    for (int i = lane; i < d; i += 32)
      dx[r * d + i] = T(s * (W(g[i]) - a - (W(xr[i]) - m) * s * b));
  }
}

}  // namespace kiln::cuda

#ifdef KILN_LAYER_NORM_FORWARD
extern "C" __global__ void __launch_bounds__(kiln::cuda::kLayerNormThreads)
    KILN_LAYER_NORM_FORWARD(const KILN_T* __restrict__ x, KILN_T* __restrict__ y,
                            KILN_T* __restrict__ mean, KILN_T* __restrict__ rstd, long long rows,
                            int d, kiln::cuda::Wide<KILN_T>::type eps) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::layer_norm_forward(x, y, mean, rstd, rows, d, eps);
}
#endif

#ifdef KILN_LAYER_NORM_BACKWARD
extern "C" __global__ void __launch_bounds__(kiln::cuda::kLayerNormThreads)
    KILN_LAYER_NORM_BACKWARD(const KILN_T* __restrict__ dy, const KILN_T* __restrict__ x,
                             const KILN_T* __restrict__ mean, const KILN_T* __restrict__ rstd,
                             KILN_T* __restrict__ dx, long long rows, int d) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::layer_norm_backward(dy, x, mean, rstd, dx, rows, d);
}
#endif
