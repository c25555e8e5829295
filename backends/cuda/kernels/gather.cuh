// Row gathers and scatter-adds (gather_rows, scatter_add_rows; graph/ops/gather_ops.cpp) and
// the report of the first index outside [0, rows): status[0] the smallest such position (the
// host set it to all ones beforehand), status[1] the index there and status[2] rows
// (index_finish). The host defines the entry it wants as the kernel's name and its types:
// KILN_T (values: float or double), KILN_I (indices); gather.cpp.
#pragma once

#include "backends/cuda/kernels/common.cuh"

namespace kiln::cuda {

// Block-stride over the rows, the block's threads along the row: out[r, c] = table[idx[r], c]
// (one index load a row, no division); a bad index's row is zero.
template <typename I, typename T>
__device__ __forceinline__ void gather_rows(const T* __restrict__ table, const I* __restrict__ idx,
                                            T* __restrict__ out, long long count, long long width,
                                            long long rows,
                                            unsigned long long* __restrict__ status) {
  for (long long r = blockIdx.x; r < count; r += gridDim.x) {
    const long long v = (long long)idx[r];
    const bool inside = v >= 0 && v < rows;
    if (!inside && threadIdx.x == 0) atomicMin(status, (unsigned long long)r);
    for (long long c = threadIdx.x; c < width; c += blockDim.x)
      out[r * width + c] = inside ? table[v * width + c] : T(0);
  }
}

// The scan scatter, for any number of output rows (the sorted one takes at most kSortedRows):
// block (x, y) makes columns [x * blockDim.x, +blockDim.x) of output rows y, y + gridDim.y, ...:
// each thread adds the rows of x whose index is the row's, in row order from zero (the CPU
// kernel's order: the same bits). The indices pass through shared memory in chunks; block
// (0, 0) also reports a bad one. Its work is rows x count x width: as much as the dense product.
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

// The sorted scatter, for at most kSortedRows output rows: one block of kSortThreads threads
// sorts the positions by index, stably (a counting sort: the counts and their prefix sums in
// shared memory, then warp 0 places the positions 32 at a time in order, ranking equal indices
// with __match_any_sync), into order[count] with starts[v] the first of index v's (starts[rows]
// = the valid positions); bad indices are reported and left out. Then scatter_segments adds
// each output row's positions in that order from zero: the same sums as scatter_add_rows in
// O(count x width) instead of O(rows x count x width).
constexpr int kSortThreads = 1024, kSortedRows = 8192;
template <typename I>
__device__ __forceinline__ void scatter_sort(const I* __restrict__ idx, long long count, int rows,
                                             int* __restrict__ order, int* __restrict__ starts,
                                             unsigned long long* __restrict__ status) {
  __shared__ int cursor[kSortedRows + 1];
  for (int v = threadIdx.x; v <= rows; v += blockDim.x) cursor[v] = 0;
  __syncthreads();
  for (long long r = threadIdx.x; r < count; r += blockDim.x) {
    const long long v = (long long)idx[r];
    if (v >= 0 && v < rows)
      atomicAdd(&cursor[v + 1], 1);
    else
      atomicMin(status, (unsigned long long)r);
  }
  __syncthreads();
  // Prefix sums over cursor[0..rows] (cursor[v + 1] holds index v's count), so that cursor[v]
  // is the first place of index v: each thread sums a run of entries, the block scans the sums.
  __shared__ int partial[kSortThreads];
  const int per = (rows + blockDim.x) / blockDim.x;
  const int lo = threadIdx.x * per, hi = min(lo + per, rows + 1);
  int total = 0;
  for (int v = lo; v < hi; ++v) total += cursor[v];
  partial[threadIdx.x] = total;
  __syncthreads();
  for (int step = 1; step < blockDim.x; step <<= 1) {
    const int add = threadIdx.x >= step ? partial[threadIdx.x - step] : 0;
    __syncthreads();
    partial[threadIdx.x] += add;
    __syncthreads();
  }
  int run = threadIdx.x > 0 ? partial[threadIdx.x - 1] : 0;
  for (int v = lo; v < hi; ++v) {
    run += cursor[v];
    cursor[v] = run;
  }
  __syncthreads();
  for (int v = threadIdx.x; v <= rows; v += blockDim.x) starts[v] = cursor[v];
  __syncthreads();
  // Placing: the block loads kSortThreads indices into shared memory, warp 0 places them.
  __shared__ int staged[kSortThreads];
  const unsigned lane = threadIdx.x % 32, below = (1u << lane) - 1;
  for (long long base = 0; base < count; base += blockDim.x) {
    const long long r = base + threadIdx.x;
    const long long v = r < count ? (long long)idx[r] : -1;
    staged[threadIdx.x] = v >= 0 && v < rows ? (int)v : -1;
    __syncthreads();
    if (threadIdx.x < 32)
      for (int at = 0; at < (int)blockDim.x && base + at < count; at += 32) {
        const int w = staged[at + lane];
        const unsigned same = __match_any_sync(0xffffffffu, w);
        if (w >= 0) order[cursor[w] + __popc(same & below)] = (int)(base + at + lane);
        __syncwarp();
        if (w >= 0 && (same & below) == 0) cursor[w] += __popc(same);  // each value's lowest lane
        __syncwarp();
      }
    __syncthreads();
  }
}

template <typename T>
__device__ __forceinline__ void scatter_segments(const T* __restrict__ x,
                                                 const int* __restrict__ order,
                                                 const int* __restrict__ starts,
                                                 T* __restrict__ out, long long width, int rows) {
  const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  for (int v = blockIdx.y; v < rows; v += gridDim.y) {
    T sum = T(0);
    for (int k = starts[v]; k < starts[v + 1]; ++k) sum += x[(long long)order[k] * width + c];
    out[v * width + c] = sum;
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
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::gather_rows(table, idx, out, count, width, rows, status);
}
#endif

#ifdef KILN_SCATTER_ADD_ROWS
extern "C" __global__ void KILN_SCATTER_ADD_ROWS(const KILN_T* __restrict__ x,
                                                 const KILN_I* __restrict__ idx,
                                                 KILN_T* __restrict__ out, long long count,
                                                 long long width, long long rows,
                                                 unsigned long long* __restrict__ status) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::scatter_add_rows(x, idx, out, count, width, rows, status);
}
#endif

#ifdef KILN_SCATTER_SORT
extern "C" __global__ void KILN_SCATTER_SORT(const KILN_I* __restrict__ idx, long long count,
                                             int rows, int* __restrict__ order,
                                             int* __restrict__ starts,
                                             unsigned long long* __restrict__ status) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::scatter_sort(idx, count, rows, order, starts, status);
}
#endif

#ifdef KILN_SCATTER_SEGMENTS
extern "C" __global__ void KILN_SCATTER_SEGMENTS(const KILN_T* __restrict__ x,
                                                 const int* __restrict__ order,
                                                 const int* __restrict__ starts,
                                                 KILN_T* __restrict__ out, long long width,
                                                 int rows) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::scatter_segments(x, order, starts, out, width, rows);
}
#endif

#ifdef KILN_INDEX_FINISH
extern "C" __global__ void KILN_INDEX_FINISH(const KILN_I* __restrict__ idx, long long rows,
                                             unsigned long long* __restrict__ status) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::index_finish(idx, rows, status);
}
#endif
