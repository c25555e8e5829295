// Pooling with 64-bit indices, any size. Max: forward and select (one thread per window)
// and the gradient as a gather (one thread per input element, summing the windows whose
// first maximum it is). Average: forward per window, gradient as a gather. Windows are
// clipped to the plane (Note [padded pooling], graph/kernels/pool_cpu.cpp). The host defines
// KILN_T and the entry it wants as the kernel's name (pool_kernels.cpp). bf16/f16 values
// compare, sum and divide as float (Wide<T>), each output rounded once.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/pool_params.h"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

// The window (oh, ow) clipped to the plane: rows [h0, h1), columns [w0, w1).
struct WindowRange {
  long long h0, h1, w0, w1;
};
__device__ __forceinline__ WindowRange window_range(const PoolShape& g, long long oh,
                                                    long long ow) {
  const long long top = oh * g.stride - g.padding, left = ow * g.stride - g.padding;
  WindowRange r;
  r.h0 = max(top, 0LL);
  r.h1 = min(top + g.kernel, g.height);
  r.w0 = max(left, 0LL);
  r.w1 = min(left + g.kernel, g.width);
  return r;
}

// The windows [lo, hi] along one axis that contain input index i (empty when lo > hi).
__device__ __forceinline__ void windows_over(long long i, long long out, const PoolShape& g,
                                             long long& lo, long long& hi) {
  const long long shifted = i + g.padding;
  lo = shifted >= g.kernel ? (shifted - g.kernel + g.stride) / g.stride : 0;
  hi = min(shifted / g.stride, out - 1);
}

// The flat index in x of window (plane, oh, ow)'s maximum, by the CPU's rule
// (graph/kernels/pool_cpu.cpp, for_each_window_max): the first maximum, and a NaN wins
// (the last NaN, as the CPU's `take` keeps taking NaNs).
template <typename T>
__device__ __forceinline__ long long window_argmax(const T* __restrict__ x, const PoolShape& g,
                                                   long long plane, long long oh, long long ow) {
  const WindowRange r = window_range(g, oh, ow);
  const long long base = plane * g.height * g.width;
  long long best = base + r.h0 * g.width + r.w0;
  T best_value = x[best];
  for (long long h = r.h0; h < r.h1; ++h)
    for (long long c = r.w0; c < r.w1; ++c) {
      const long long at = base + h * g.width + c;
      const T v = x[at];
      const bool take = v > best_value || v != v;
      best = take ? at : best;
      best_value = take ? v : best_value;
    }
  return best;
}

// y[window] = src[argmax of x over the window]; src is x (forward) or g (select).
template <typename T>
__device__ __forceinline__ void max_pool_gather(const T* __restrict__ x, const T* __restrict__ src,
                                                T* __restrict__ y, const PoolShape& g) {
  const long long n = g.planes * g.out_h * g.out_w;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long ow = i % g.out_w;
    const long long oh = (i / g.out_w) % g.out_h;
    const long long plane = i / (g.out_w * g.out_h);
    y[i] = src[window_argmax(x, g, plane, oh, ow)];
  }
}

// dx[e] = sum of dy over the windows containing e (in window order, as the CPU adds them)
// whose maximum is e (relu: max_pool2d_grad relu=1's mask of dy, the maximum being x[e]).
// Without overlap (stride >= kernel) at most one window contains e.
template <typename T>
__device__ __forceinline__ void max_pool_grad(const T* __restrict__ x, const T* __restrict__ dy,
                                              T* __restrict__ dx, const PoolShape& g, int relu) {
  typedef typename Wide<T>::type W;
  const long long n = g.planes * g.height * g.width;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long plane = i / (g.width * g.height);
    long long oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over(iw, g.out_w, g, ow_lo, ow_hi);
    W sum = 0;
    for (long long oh = oh_lo; oh <= oh_hi; ++oh)
      for (long long ow = ow_lo; ow <= ow_hi; ++ow)
        if (window_argmax(x, g, plane, oh, ow) == i)
          sum += relu_routed(W(dy[(plane * g.out_h + oh) * g.out_w + ow]), W(x[i]), relu);
    dx[i] = T(sum);
  }
}

// Average pooling, as the CPU computes it: the window's cells summed in row-major order
// from 0 and divided by their count.
template <typename T>
__device__ __forceinline__ void avg_pool_forward(const T* __restrict__ x, T* __restrict__ y,
                                                 const PoolShape& g) {
  const long long n = g.planes * g.out_h * g.out_w;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long ow = i % g.out_w;
    const long long oh = (i / g.out_w) % g.out_h;
    const T* __restrict__ in = x + i / (g.out_w * g.out_h) * g.height * g.width;
    const WindowRange r = window_range(g, oh, ow);
    typedef typename Wide<T>::type W;
    W sum = W(0);
    for (long long h = r.h0; h < r.h1; ++h)
      for (long long c = r.w0; c < r.w1; ++c) sum += in[h * g.width + c];
    y[i] = T(sum / (W)((r.h1 - r.h0) * (r.w1 - r.w0)));
  }
}

// The gradient: a gather per input element of dy[w] / cells(w) over the windows w
// containing it, in window order.
template <typename T>
__device__ __forceinline__ void avg_pool_grad(const T* __restrict__ dy, T* __restrict__ dx,
                                              const PoolShape& g) {
  const long long n = g.planes * g.height * g.width;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const T* __restrict__ grad = dy + i / (g.width * g.height) * g.out_h * g.out_w;
    long long oh_lo, oh_hi, ow_lo, ow_hi;
    windows_over(ih, g.out_h, g, oh_lo, oh_hi);
    windows_over(iw, g.out_w, g, ow_lo, ow_hi);
    typedef typename Wide<T>::type W;
    W sum = W(0);
    for (long long oh = oh_lo; oh <= oh_hi; ++oh)
      for (long long ow = ow_lo; ow <= ow_hi; ++ow) {
        const WindowRange r = window_range(g, oh, ow);
        sum += grad[oh * g.out_w + ow] / (W)((r.h1 - r.h0) * (r.w1 - r.w0));
      }
    dx[i] = T(sum);
  }
}

}  // namespace kiln::cuda

#ifdef KILN_MAX_POOL_FORWARD
extern "C" __global__ void KILN_MAX_POOL_FORWARD(const KILN_T* __restrict__ x,
                                                 KILN_T* __restrict__ y, kiln::cuda::PoolShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool_gather(x, x, y, g);
}
#endif

#ifdef KILN_MAX_POOL_SELECT
extern "C" __global__ void KILN_MAX_POOL_SELECT(const KILN_T* __restrict__ x,
                                                const KILN_T* __restrict__ src,
                                                KILN_T* __restrict__ y, kiln::cuda::PoolShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool_gather(x, src, y, g);
}
#endif

#ifdef KILN_MAX_POOL_GRAD
extern "C" __global__ void KILN_MAX_POOL_GRAD(const KILN_T* __restrict__ x,
                                              const KILN_T* __restrict__ dy,
                                              KILN_T* __restrict__ dx, kiln::cuda::PoolShape g,
                                              int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::max_pool_grad(x, dy, dx, g, relu);
}
#endif

#ifdef KILN_AVG_POOL_FORWARD
extern "C" __global__ void KILN_AVG_POOL_FORWARD(const KILN_T* __restrict__ x,
                                                 KILN_T* __restrict__ y, kiln::cuda::PoolShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::avg_pool_forward(x, y, g);
}
#endif

#ifdef KILN_AVG_POOL_GRAD
extern "C" __global__ void KILN_AVG_POOL_GRAD(const KILN_T* __restrict__ dy,
                                              KILN_T* __restrict__ dx, kiln::cuda::PoolShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::avg_pool_grad(dy, dx, g);
}
#endif
