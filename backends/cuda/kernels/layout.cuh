// The layout kernels: transpose (by element size, any permutation of rank <= 8), concat (by
// element size, up to 32 pieces a launch), one_hot with an out-of-range report, and fill.
// The host defines the entry it wants as the kernel's name and its types: KILN_U (an
// unsigned integer of the element's size), KILN_L (labels), KILN_T (values: f32, f64 or the
// bf16/f16 storage types); layout_kernels.cpp.
#pragma once

#include "backends/cuda/kernels/common.cuh"
#include "backends/cuda/kernels/layout_params.h"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

// One thread per output element: coalesced writes, gathered reads.
template <typename U>
__device__ __forceinline__ void transpose(const U* __restrict__ x, U* __restrict__ y,
                                          const TransposeShape& s, long long n) {
  KILN_FOR_EACH_ITEM(i, n) {
    long long offset = 0, rest = i;
    for (int d = s.rank - 1; d >= 0; --d) {
      offset += (rest % s.dims[d]) * s.src_strides[d];
      rest /= s.dims[d];
    }
    y[i] = x[offset];
  }
}

// One thread per output element of the launch's columns [base, base + width) of each of
// `outer` rows of `row` elements; the piece is found by binary search over the ends.
template <typename U>
__device__ __forceinline__ void concat(const ConcatPieces& p, U* __restrict__ out, long long outer,
                                       long long row, long long base, long long width) {
  const long long n = outer * width;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long r = i / width, col = i - r * width;
    int lo = 0, hi = p.count - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (col < p.end[mid])
        hi = mid;
      else
        lo = mid + 1;
    }
    const long long start = lo > 0 ? p.end[lo - 1] : 0;
    const U* src = (const U*)p.src[lo];
    out[r * row + base + col] = src[r * (p.end[lo] - start) + (col - start)];
  }
}

// out: [rows, classes]; a row whose label is outside [0, classes) stays all zero and the
// smallest such row index goes to status[0] (which the host set to all ones beforehand).
template <typename L, typename T>
__device__ __forceinline__ void one_hot(const L* __restrict__ labels, T* __restrict__ out,
                                        long long rows, long long classes,
                                        unsigned long long* __restrict__ status) {
  const long long n = rows * classes;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long row = i / classes;
    const long long column = i - row * classes;
    const long long label = (long long)labels[row];
    out[i] = label == column ? T(1) : T(0);
    if (column == 0 && (label < 0 || label >= classes)) atomicMin(status, (unsigned long long)row);
  }
}

// One thread: status[1] = the label at the bad row status[0], if there is one.
template <typename L>
__device__ __forceinline__ void one_hot_finish(const L* __restrict__ labels,
                                               unsigned long long* __restrict__ status) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const unsigned long long row = status[0];
  if (row != ~0ull) status[1] = (unsigned long long)(long long)labels[row];
}

}  // namespace kiln::cuda

#ifdef KILN_TRANSPOSE
extern "C" __global__ void KILN_TRANSPOSE(const KILN_U* __restrict__ x, KILN_U* __restrict__ y,
                                          kiln::cuda::TransposeShape s, long long n) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::transpose(x, y, s, n);
}
#endif

#ifdef KILN_CONCAT
extern "C" __global__ void KILN_CONCAT(kiln::cuda::ConcatPieces p, KILN_U* __restrict__ out,
                                       long long outer, long long row, long long base,
                                       long long width) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::concat(p, out, outer, row, base, width);
}
#endif

#ifdef KILN_ONE_HOT
extern "C" __global__ void KILN_ONE_HOT(const KILN_L* __restrict__ labels, KILN_T* __restrict__ out,
                                        long long rows, long long classes,
                                        unsigned long long* __restrict__ status) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::one_hot(labels, out, rows, classes, status);
}
#endif

#ifdef KILN_ONE_HOT_FINISH
extern "C" __global__ void KILN_ONE_HOT_FINISH(const KILN_L* __restrict__ labels,
                                               unsigned long long* __restrict__ status) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::one_hot_finish(labels, status);
}
#endif

#ifdef KILN_FILL
extern "C" __global__ void KILN_FILL(KILN_T* __restrict__ out, KILN_T value, long long n) {
  KILN_AFTER_PRIOR_GRIDS();
  KILN_FOR_EACH_ITEM(i, n) out[i] = value;
}
#endif
