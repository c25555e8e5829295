// The data-movement kernels of the im2col + cuBLAS convolution fallback: im2col (one thread
// per patch-matrix element) and col2im as a gather (one thread per input element, no
// atomics); the ordered sum of the implicit GEMM's split-K partials; and conv2d_bias's
// epilogue over a stored NCHW output (bias per channel, then ReLU). The host defines
// KILN_T (the element type) and the entry it wants as the kernel's name (conv_kernels.cpp).
// For bf16/f16 the sums are float: col2im gathers a float col (cuBLAS's f32 result) and
// splitk_sum float partials, and each output is rounded once, where it is stored.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

// col[(c, kh, kw), (oh, ow)] of image b = x[b, c, oh*s - p + kh, ow*s - p + kw], 0 outside.
template <typename T>
__device__ __forceinline__ void im2col(const T* __restrict__ x, T* __restrict__ col,
                                       const ConvShape& g) {
  const long long cols = g.out_h * g.out_w;
  const long long rows = g.channels * g.kernel_h * g.kernel_w;
  const long long n = g.images * rows * cols;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long ohw = i % cols;
    const long long row = (i / cols) % rows;
    const long long b = i / (cols * rows);
    const long long kw = row % g.kernel_w;
    const long long kh = (row / g.kernel_w) % g.kernel_h;
    const long long c = row / (g.kernel_w * g.kernel_h);
    const long long ih = (ohw / g.out_w) * g.stride - g.padding + kh;
    const long long iw = (ohw % g.out_w) * g.stride - g.padding + kw;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    col[b * g.image_stride + row * g.row_stride + ohw] =
        inside ? x[((b * g.channels + c) * g.height + ih) * g.width + iw] : T(0);
  }
}

// The adjoint of im2col: x[b, c, ih, iw] = sum over (kh, kw) of the col element that read
// it, in the CPU col2im's order of (kh, kw), so each element's sum is deterministic.
template <typename T>
__device__ __forceinline__ void col2im(const typename Wide<T>::type* __restrict__ col,
                                       T* __restrict__ x, const ConvShape& g) {
  typedef typename Wide<T>::type W;
  const long long n = g.images * g.channels * g.height * g.width;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long iw = i % g.width;
    const long long ih = (i / g.width) % g.height;
    const long long c = (i / (g.width * g.height)) % g.channels;
    const long long b = i / (g.width * g.height * g.channels);
    const W* image = col + b * g.image_stride;
    W sum = W(0);
    for (long long kh = 0; kh < g.kernel_h; ++kh) {
      const long long oh_s = ih + g.padding - kh;  // oh * stride
      if (oh_s < 0 || oh_s % g.stride != 0 || oh_s / g.stride >= g.out_h) continue;
      for (long long kw = 0; kw < g.kernel_w; ++kw) {
        const long long ow_s = iw + g.padding - kw;
        if (ow_s < 0 || ow_s % g.stride != 0 || ow_s / g.stride >= g.out_w) continue;
        const long long row = (c * g.kernel_h + kh) * g.kernel_w + kw;
        sum += image[row * g.row_stride + (oh_s / g.stride) * g.out_w + ow_s / g.stride];
      }
    }
    x[i] = T(sum);
  }
}

// out[i] = sum over z of part[z * mn + i] in a fixed order for a given (splits, lanes): z
// ascending within each of `lanes` classes (class y takes z = y, y + lanes, ...), then the
// classes in order, each class's sum starting from 0, and a +0 for the classes that have no
// split (the order of the kernel that gave every class a thread: the same bits). Blocks of
// (X, Y) threads, Y = min(lanes, splits) (a thread per non-empty class), X outputs each.
template <typename T>
__device__ __forceinline__ void splitk_sum(const typename Wide<T>::type* __restrict__ part,
                                           T* __restrict__ out, int mn, int splits, int lanes) {
  typedef typename Wide<T>::type W;
  __shared__ W sums[256 + 32];  // rows of blockDim.x + 1: X * Y <= 256, Y <= 32
  const int row = blockDim.x + 1, i = blockIdx.x * blockDim.x + threadIdx.x;
  W s = W(0);
  if (i < mn)
    for (int z = threadIdx.y; z < splits; z += lanes) s += part[(size_t)z * mn + i];
  sums[threadIdx.y * row + threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && i < mn) {
    W total = sums[threadIdx.x];
    for (int y = 1; y < blockDim.y; ++y) total += sums[y * row + threadIdx.x];
    if (splits < lanes) total += W(0);  // the empty classes' zeros (-0 becomes +0)
    out[i] = T(total);
  }
}

}  // namespace kiln::cuda

#ifdef KILN_IM2COL
extern "C" __global__ void KILN_IM2COL(const KILN_T* __restrict__ x, KILN_T* __restrict__ col,
                                       kiln::cuda::ConvShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::im2col(x, col, g);
}
#endif

#ifdef KILN_COL2IM
extern "C" __global__ void KILN_COL2IM(const kiln::cuda::Wide<KILN_T>::type* __restrict__ col,
                                       KILN_T* __restrict__ x, kiln::cuda::ConvShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::col2im(col, x, g);
}
#endif

#ifdef KILN_SPLITK_SUM
extern "C" __global__ void KILN_SPLITK_SUM(const kiln::cuda::Wide<KILN_T>::type* __restrict__ part,
                                           KILN_T* __restrict__ out, int mn, int splits,
                                           int lanes) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::splitk_sum(part, out, mn, splits, lanes);
}
#endif

#ifdef KILN_CONV_BIAS
// y[b, o, :, :] += bias[o], then ReLU (v > 0 ? v : 0, NaN to 0, as the relu op) where relu:
// in place over the stored output, computed wide and rounded once, as the unfused ops.
extern "C" __global__ void KILN_CONV_BIAS(KILN_T* __restrict__ y, const KILN_T* __restrict__ bias,
                                          long long plane, long long channels, long long n,
                                          int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  typedef kiln::cuda::Wide<KILN_T>::type W;
  KILN_FOR_EACH_ITEM(i, n) {
    W v = (W)y[i] + (W)bias[(i / plane) % channels];
    if (relu) v = v > W(0) ? v : W(0);
    y[i] = KILN_T(v);
  }
}
#endif

#ifdef KILN_CONV_MOMENTS
// conv2d_moments' run moments of a stored NCHW output y [B, C, plane], where the convolution's
// epilogue does not compute them: a thread a (channel, run of 64 pixels in (image, pixel)
// order), its count, mean and squared deviations from that mean into moments [3, runs, C] (the
// CPU kernel's order, graph/ops/conv_ops.cpp).
extern "C" __global__ void KILN_CONV_MOMENTS(const KILN_T* __restrict__ y,
                                             float* __restrict__ moments, long long plane,
                                             long long channels, long long pixels, long long runs) {
  KILN_AFTER_PRIOR_GRIDS();
  typedef kiln::cuda::Wide<KILN_T>::type W;
  KILN_FOR_EACH_ITEM(i, channels * runs) {
    const long long c = i / runs, t = i - c * runs, first = t * 64;
    const int count = static_cast<int>(pixels - first < 64 ? pixels - first : 64);
    // Pixel first + j of channel c: j past the run's first, a plane of the other channels
    // skipped at each image the run enters.
    const long long pixel = first % plane;
    const KILN_T* run = y + (first / plane * channels + c) * plane + pixel;
    auto value = [&](int j) {
      return static_cast<float>(
          static_cast<W>(run[j + (pixel + j) / plane * (channels - 1) * plane]));
    };
    float sum = 0.0f;
    for (int j = 0; j < count; ++j) sum += value(j);
    const float mean = sum / static_cast<float>(count);
    float squares = 0.0f;
    for (int j = 0; j < count; ++j) squares += (value(j) - mean) * (value(j) - mean);
    const long long at = t * channels + c;  // moments [3, runs, C]
    moments[at] = static_cast<float>(count);
    moments[channels * runs + at] = mean;
    moments[2 * channels * runs + at] = squares;
  }
}
#endif
