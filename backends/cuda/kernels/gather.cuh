// Row gathers and scatter-adds (gather_rows, scatter_add_rows; graph/ops/gather_ops.cpp) and
// the report of the first index outside [0, rows): status[0] the smallest such position (the
// host set it to all ones beforehand), status[1] the index there and status[2] rows
// (index_finish). The host
// defines the entry it wants as the kernel's name and its types: KILN_T (values: float or
// double), KILN_I (indices); gather.cpp.
#pragma once

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda {

// One thread per output element: out[r, c] = table[idx[r], c]; a bad index's row is zero.
template <typename I, typename T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ table, const I* __restrict__ idx,
                                            T* __restrict__ out, long long count, long long width,
                                            long long rows,
                                            unsigned long long* __restrict__ status) {
  const long long n = count * width;
  KILN_FOR_EACH_ITEM(i, n) {
    const long long r = i / width, c = i - r * width;
    const long long v = (long long)idx[r];
    const bool inside = v >= 0 && v < rows;
    out[i] = inside ? table[v * width + c] : T(0);
    if (!inside && c == 0) atomicMin(status, (unsigned long long)r);
  }
}

// Block (x, y) makes columns [x * blockDim.x, +blockDim.x) of output rows y, y + gridDim.y, ...:
// each thread adds
// the rows of x whose index is the row's, in row order from zero (the CPU kernel's order: the same
// bits). The indices pass through shared memory in chunks; block (0, 0) also reports a bad one.
constexpr int kScatterChunk = 1024;
template <typename I, typename T>
__device__ __forceinline__ void scatter_add_rows(const T* __restrict__ x, const I* __restrict__ idx,
                                                 T* __restrict__ out, long long count,
                                                 long long width, long long rows,
                                                 unsigned long long* __restrict__ status) {
  __shared__ long long chunk[kScatterChunk];
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const bool reports = blockIdx.x == 0 && blockIdx.y == 0;
  for (long long v = blockIdx.y; v < rows; v += gridDim.y) {  // the grid's y is at most 65535
    T sum = T(0);
    for (long long first = 0; first < count; first += kScatterChunk) {
      const int length = (int)(count - first < kScatterChunk ? count - first : kScatterChunk);
      __syncthreads();
      for (int k = threadIdx.x; k < length; k += blockDim.x) {
        chunk[k] = (long long)idx[first + k];
        if (reports && v == 0 && (chunk[k] < 0 || chunk[k] >= rows))
          atomicMin(status, (unsigned long long)(first + k));
      }
      __syncthreads();
      if (c < width)
        for (int k = 0; k < length; ++k)
          if (chunk[k] == v) sum += x[(first + k) * width + c];
    }
    if (c < width) out[v * width + c] = sum;
  }
}

// One thread: status[1] = the index at the bad position status[0], if there is one, and
// status[2] = rows (for the host's message).
template <typename I>
__device__ __forceinline__ void index_finish(const I* __restrict__ idx, long long rows,
                                             unsigned long long* __restrict__ status) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  status[2] = (unsigned long long)rows;
  const unsigned long long position = status[0];
  if (position != ~0ull) status[1] = (unsigned long long)(long long)idx[position];
}

}  // namespace kiln::cuda

#ifdef KILN_GATHER_ROWS
extern "C" __global__ void KILN_GATHER_ROWS(const KILN_T* __restrict__ table,
                                            const KILN_I* __restrict__ idx,
                                            KILN_T* __restrict__ out, long long count,
                                            long long width, long long rows,
                                            unsigned long long* __restrict__ status) {
  kiln::cuda::gather_rows(table, idx, out, count, width, rows, status);
}
#endif

#ifdef KILN_SCATTER_ADD_ROWS
extern "C" __global__ void KILN_SCATTER_ADD_ROWS(const KILN_T* __restrict__ x,
                                                 const KILN_I* __restrict__ idx,
                                                 KILN_T* __restrict__ out, long long count,
                                                 long long width, long long rows,
                                                 unsigned long long* __restrict__ status) {
  kiln::cuda::scatter_add_rows(x, idx, out, count, width, rows, status);
}
#endif

#ifdef KILN_INDEX_FINISH
extern "C" __global__ void KILN_INDEX_FINISH(const KILN_I* __restrict__ idx, long long rows,
                                             unsigned long long* __restrict__ status) {
  kiln::cuda::index_finish(idx, rows, status);
}
#endif
