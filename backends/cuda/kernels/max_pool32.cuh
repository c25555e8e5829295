// Max pooling with 32-bit indices (PoolShape32, planes * H * W < 2^30): forward and select
// with the window size fixed at 2 (KILN_WINDOW 2) or any (0); the gradient as one thread per
// cell of windows that do not overlap (stride >= kernel; KILN_EXACT2: exact 2x2 cells) or as
// a gather per input element (overlap: whole small planes a block, each window's maximum found
// once in shared memory; larger planes straight from global memory). The host defines KILN_T, the
// entry it wants as the kernel's name and that entry's constants (pool_kernels.cpp). bf16/f16
// values compare and sum as float (Wide<T>), each output rounded once.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/pool_params.h"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

// The CPU's first maximum (a NaN wins, the last NaN) of the window whose top-left element
// is x[corner] (no padding); KS > 0 fixes the window size.
template <int KS, typename T>
__device__ __forceinline__ int window_max32(const T* __restrict__ x, const PoolShape32& g,
                                            int corner, T& best_value) {
  const int k = KS > 0 ? KS : g.kernel;
  int best = corner;
  best_value = x[corner];
#pragma unroll
  for (int kh = 0; kh < k; ++kh)
#pragma unroll
    for (int kw = 0; kw < k; ++kw) {
      const int at = corner + kh * g.width + kw;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}

// The same for window (plane, oh, ow) with any padding, clipped to the plane.
template <typename T>
__device__ __forceinline__ int window_max32_clipped(const T* __restrict__ x, const PoolShape32& g,
                                                    int plane, int oh, int ow, T& best_value) {
  const int top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
  const int h0 = max(top, 0), h1 = min(top + g.kernel, g.height);
  const int w0 = max(left, 0), w1 = min(left + g.kernel, g.width);
  const int base = plane * g.height * g.width;
  int best = base + h0 * g.width + w0;
  best_value = x[best];
  for (int h = h0; h < h1; ++h)
    for (int c = w0; c < w1; ++c) {
      const int at = base + h * g.width + c;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}

// The windows [lo, hi] along one axis that contain input index i (empty when lo > hi).
__device__ __forceinline__ void windows_over32(int i, int out, const PoolShape32& g, int& lo,
                                               int& hi) {
  const int shifted = i + g.padding;
  lo = shifted >= g.kernel ? (shifted - g.kernel + g.stride) / g.stride : 0;
  hi = min(shifted / g.stride, out - 1);
}

// Window i -> (plane, oh, ow).
__device__ __forceinline__ void window_coords(const PoolShape32& g, int i, int& plane, int& oh,
                                              int& ow) {
  ow = i % g.out_w;
  const int r = i / g.out_w;
  oh = r % g.out_h;
  plane = r / g.out_h;
}

// Window i = (plane, oh, ow) -> its top-left element (no padding).
__device__ __forceinline__ int window_corner(const PoolShape32& g, int i, int& oh, int& ow) {
  ow = i % g.out_w;
  const int r = i / g.out_w;
  oh = r % g.out_h;
  const int plane = r / g.out_h;
  return (plane * g.height + oh * g.stride) * g.width + ow * g.stride;
}

// forward (SELECT false): y = max of x's window; select: y = src at the window's first
// maximum. KS = 2: 2x2 windows without padding; KS = 0: any window and padding.
template <bool SELECT, int KS, typename T>
__device__ __forceinline__ void max_pool32_gather(const T* __restrict__ x,
                                                  const T* __restrict__ src, T* __restrict__ y,
                                                  const PoolShape32& g) {
  const int n = g.planes * g.out_h * g.out_w;
  KILN_FOR_EACH_ITEM32(i, n) {
    int plane, oh, ow;
    window_coords(g, i, plane, oh, ow);
    T best_value;
    const int best = KS > 0 ? window_max32<KS>(x, g, window_corner(g, i, oh, ow), best_value)
                            : window_max32_clipped(x, g, plane, oh, ow, best_value);
    y[i] = SELECT ? src[best] : best_value;
  }
}

// Windows that do not overlap (stride >= kernel): the cells [oh*s, (oh+1)*s) x [ow*s, (ow+1)*s),
// the last row and column of cells reaching the plane's edge, partition the plane, and each
// window lies in its cell. One thread per cell writes all of it: 0 + dy (as the CPU adds dy
// to a zeroed dx) at the window's first maximum, 0 elsewhere. EXACT2: every cell is 2x2. relu
// (in every gradient here): max_pool2d_grad relu=1, dy masked by the window's maximum > 0.
template <bool EXACT2, typename T>
__device__ __forceinline__ void max_pool32_grad_cells(const T* __restrict__ x,
                                                      const T* __restrict__ dy, T* __restrict__ dx,
                                                      const PoolShape32& g, int relu) {
  typedef typename Wide<T>::type W;
  const int n = g.planes * g.out_h * g.out_w;
  KILN_FOR_EACH_ITEM32(i, n) {
    int oh, ow;
    T best_value;
    const int corner = window_corner(g, i, oh, ow);
    const int best = window_max32 < EXACT2 ? 2 : 0 > (x, g, corner, best_value);
    const T value = T(W(0) + relu_routed(W(dy[i]), W(best_value), relu));  // exact: 0 + dy
    if (EXACT2) {
      dx[corner] = best == corner ? value : T(0);
      dx[corner + 1] = best == corner + 1 ? value : T(0);
      dx[corner + g.width] = best == corner + g.width ? value : T(0);
      dx[corner + g.width + 1] = best == corner + g.width + 1 ? value : T(0);
      continue;
    }
    const int rows = oh == g.out_h - 1 ? g.height - oh * g.stride : g.stride;
    const int cols = ow == g.out_w - 1 ? g.width - ow * g.stride : g.stride;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const int at = corner + r * g.width + c;
        dx[at] = best == at ? value : T(0);
      }
  }
}

// Overlapping or padded windows: the gather of pool.cuh's max_pool_grad, 32-bit indices.
template <typename T>
__device__ __forceinline__ void max_pool32_grad_overlap(const T* __restrict__ x,
                                                        const T* __restrict__ dy,
                                                        T* __restrict__ dx, const PoolShape32& g,
                                                        int relu) {
  typedef typename Wide<T>::type W;
  const int n = g.planes * g.height * g.width;
  KILN_FOR_EACH_ITEM32(i, n) {
    const int iw = i % g.width;
    const int r = i / g.width;
    const int ih = r % g.height;
    const int plane = r / g.height;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over32(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over32(iw, g.out_w, g, ow_lo, ow_hi);
    W sum = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        T best_value;
        if (window_max32_clipped(x, g, plane, oh, ow, best_value) == i)
          sum += relu_routed(W(dy[(plane * g.out_h + oh) * g.out_w + ow]), W(best_value), relu);
      }
    dx[i] = T(sum);
  }
}

// Overlapping or padded windows over planes of at most kPlaneCells cells (and windows): a
// block takes whole planes (planes_per_block: as many as fit, but leaving enough blocks),
// stages their cells in shared memory as W, finds each window's first maximum once
// (window_max32_clipped's rule, on the staged values: the same comparisons), then gathers as
// max_pool32_grad_overlap does, in the same window order: the same bits. A 3x3 stride-1
// window's cells are each read by 9 windows, so the gather kernel above found every maximum 9
// times from global memory. (kPlaneCells and planes_per_block: pool_params.h.)
template <typename T>
__device__ __forceinline__ void max_pool32_grad_planes(const T* __restrict__ x,
                                                       const T* __restrict__ dy, T* __restrict__ dx,
                                                       const PoolShape32& g, int relu) {
  typedef typename Wide<T>::type W;
  __shared__ W cells[kPlaneCells];
  __shared__ int argmax[kPlaneCells];  // each window's maximum, as h * width + w in its plane
  const int per = planes_per_block(g), first = blockIdx.x * per;
  const int planes = min(per, g.planes - first);
  const int plane_cells = g.height * g.width, plane_windows = g.out_h * g.out_w;
  const T* xs = x + (long long)first * plane_cells;
  for (int i = threadIdx.x; i < planes * plane_cells; i += blockDim.x) cells[i] = W(xs[i]);
  __syncthreads();
  for (int i = threadIdx.x; i < planes * plane_windows; i += blockDim.x) {
    const int p = i / plane_windows, oh = i % plane_windows / g.out_w, ow = i % g.out_w;
    const int top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
    const int h0 = max(top, 0), h1 = min(top + g.kernel, g.height);
    const int w0 = max(left, 0), w1 = min(left + g.kernel, g.width);
    const W* plane = cells + p * plane_cells;
    int best = h0 * g.width + w0;
    W best_value = plane[best];
    for (int h = h0; h < h1; ++h)
      for (int c = w0; c < w1; ++c) {
        const int at = h * g.width + c;
        const W v = plane[at];
        const bool take = v > best_value || v != v;
        best = take ? at : best;
        best_value = take ? v : best_value;
      }
    argmax[i] = best;
  }
  __syncthreads();
  const T* dys = dy + (long long)first * plane_windows;
  T* dxs = dx + (long long)first * plane_cells;
  for (int i = threadIdx.x; i < planes * plane_cells; i += blockDim.x) {
    const int p = i / plane_cells, at = i % plane_cells;
    int oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over32(at / g.width, g.out_h, g, oh_lo, oh_hi);
    windows_over32(at % g.width, g.out_w, g, ow_lo, ow_hi);
    W sum = 0;
    for (int oh = oh_lo; oh <= oh_hi; ++oh)
      for (int ow = ow_lo; ow <= ow_hi; ++ow) {
        const int window = p * plane_windows + oh * g.out_w + ow;
        if (argmax[window] == at)
          sum += relu_routed(W(dys[window]), cells[p * plane_cells + at], relu);
      }
    dxs[i] = T(sum);
  }
}

}  // namespace kiln::cuda

#ifdef KILN_MAX_POOL32_FORWARD
extern "C" __global__ void KILN_MAX_POOL32_FORWARD(const KILN_T* __restrict__ x,
                                                   KILN_T* __restrict__ y,
                                                   kiln::cuda::PoolShape32 g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool32_gather<false, KILN_WINDOW>(x, x, y, g);
}
#endif

#ifdef KILN_MAX_POOL32_SELECT
extern "C" __global__ void KILN_MAX_POOL32_SELECT(const KILN_T* __restrict__ x,
                                                  const KILN_T* __restrict__ src,
                                                  KILN_T* __restrict__ y,
                                                  kiln::cuda::PoolShape32 g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool32_gather<true, KILN_WINDOW>(x, src, y, g);
}
#endif

#ifdef KILN_MAX_POOL32_GRAD_CELLS
extern "C" __global__ void KILN_MAX_POOL32_GRAD_CELLS(const KILN_T* __restrict__ x,
                                                      const KILN_T* __restrict__ dy,
                                                      KILN_T* __restrict__ dx,
                                                      kiln::cuda::PoolShape32 g, int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool32_grad_cells<KILN_EXACT2 != 0>(x, dy, dx, g, relu);
}
#endif

#ifdef KILN_MAX_POOL32_GRAD_OVERLAP
extern "C" __global__ void KILN_MAX_POOL32_GRAD_OVERLAP(const KILN_T* __restrict__ x,
                                                        const KILN_T* __restrict__ dy,
                                                        KILN_T* __restrict__ dx,
                                                        kiln::cuda::PoolShape32 g, int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool32_grad_overlap(x, dy, dx, g, relu);
}
#endif

#ifdef KILN_MAX_POOL32_GRAD_PLANES
extern "C" __global__ void __launch_bounds__(kiln::cuda::kPlaneThreads)
    KILN_MAX_POOL32_GRAD_PLANES(const KILN_T* __restrict__ x, const KILN_T* __restrict__ dy,
                                KILN_T* __restrict__ dx, kiln::cuda::PoolShape32 g, int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool32_grad_planes(x, dy, dx, g, relu);
}
#endif
