// The persistent LSTM forward (lstm_sequence in one launch; notes in lstm.h): a cooperative
// grid whose blocks keep their slice of the recurrent weight in shared memory for all steps
// and wait for the blocks of their row group at a barrier between steps, so a step costs a
// barrier, not a launch and a reload of the weight. (A persistent backward of the same design
// was correct but slower than the per-step kernels on the H200: char-lstm 1.09 -> 1.28-1.47
// ms, bimodal; it holds 96 KiB of shared memory per block.) The host defines KILN_T and
// KILN_LSTM_PERSISTENT_FORWARD, the kernel's name (lstm_persistent_kernels.cpp). Shared
// memory, the sums and the carried c are W = Wide<T>::type (float for bf16 and f16).
#pragma once

#include "backends/cuda/kernels/grid_barrier.cuh"
#include "backends/cuda/kernels/lstm_cell.cuh"

namespace kiln::cuda {

// Four elements from past L1 (other blocks wrote them this launch), widened.
__device__ __forceinline__ Quad<float> load_l2(const float* p) {
  const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
  Quad<float> q;
  q.v[0] = v.x;
  q.v[1] = v.y;
  q.v[2] = v.z;
  q.v[3] = v.w;
  return q;
}
__device__ __forceinline__ Quad<double> load_l2(const double* p) {
  const double2 a = __ldcg(reinterpret_cast<const double2*>(p)),
                b = __ldcg(reinterpret_cast<const double2*>(p) + 1);
  Quad<double> q;
  q.v[0] = a.x;
  q.v[1] = a.y;
  q.v[2] = b.x;
  q.v[3] = b.y;
  return q;
}
template <typename T>  // Bf16, F16: one 8-byte load
__device__ __forceinline__ Quad<float> load_l2(const T* p) {
  const uint2 v = __ldcg(reinterpret_cast<const uint2*>(p));
  const unsigned words[4] = {v.x & 0xffffu, v.x >> 16, v.y & 0xffffu, v.y >> 16};
  Quad<float> q;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    T e;
    e.bits = (unsigned short)words[i];
    q.v[i] = e;
  }
  return q;
}
// Rows row0 .. row0 + 15 of a [batch, width] matrix into dst[r * width / 4 + i] as Quads
// (zeros past the batch): eight loads in flight per thread before any store, so a step
// waits for about one round trip to L2, not one per load.
template <typename T, typename W>
__device__ __forceinline__ void rows_to_shared(Quad<W>* dst, const T* src, int row0, int batch,
                                               int width) {
  const int quads = width / 4, n = 16 * quads;
  for (int base = threadIdx.x; base < n; base += 256 * 8) {
    Quad<W> q[8];
#pragma unroll
    for (int x = 0; x < 8; ++x) {
      const int e = base + 256 * x, r = e / quads;
      q[x] = Quad<W>{{W(0), W(0), W(0), W(0)}};
      if (e < n && row0 + r < batch)
        q[x] = load_l2(src + (long long)(row0 + r) * width + 4 * (e % quads));
    }
#pragma unroll
    for (int x = 0; x < 8; ++x)
      if (base + 256 * x < n) dst[base + 256 * x] = q[x];
  }
}

// A block owns 8 hidden units (j0 ..) and 16 batch rows (row0 ..), 256 threads; the blocks
// of one row group (blockIdx.y) wait for each other between steps (bar + 2 * blockIdx.y); dynamic
// shared memory holds us[k][c] = u[k][g * H + j0 + uu] (c = 8 g + uu; H x 32) and the step's
// h_prev rows hsm[r][k] (16 x H), which then holds the two K halves' partial gates red[kh][r][c].
// Warp w takes rows 4 (w % 4) .. + 3 and the K half w / 4; lane = column c; the first 128
// threads own (row r, unit uu) for the cell and carry c in a register across steps.
// Requires H % 32 == 0 (whole unit blocks, aligned 4-element loads).
template <typename T>
__device__ __forceinline__ void lstm_persistent_forward(
    const T* __restrict__ projected, const T* __restrict__ u, const T* __restrict__ h0,
    const T* __restrict__ c0, T* hs, T* __restrict__ cs, T* __restrict__ acts, unsigned* bar,
    int batch, int hidden, int steps, int reverse) {
  typedef typename Wide<T>::type W;
  extern __shared__ Quad<W> smem_quads[];
  W* us = reinterpret_cast<W*>(smem_quads);
  W* hsm = us + 32 * hidden;
  const int j0 = blockIdx.x * 8, row0 = blockIdx.y * 16;
  const unsigned blocks = gridDim.x;  // of this row group
  bar += 2 * blockIdx.y;
  for (int e = threadIdx.x; e < 32 * hidden; e += 256) {
    const int k = e / 32, c = e % 32;
    us[e] = u[(long long)k * 4 * hidden + (c / 8) * hidden + j0 + c % 8];
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, rg = w & 3, kh = w >> 2,
            half = hidden / 2;
  const int r_own = threadIdx.x / 8, uu = threadIdx.x % 8, b = row0 + r_own, j = j0 + uu;
  const bool owner = threadIdx.x < 128 && b < batch;
  W c_carry = owner ? W(c0[(long long)b * hidden + j]) : W(0);
  for (int s = 0; s < steps; ++s) {
    const int t = reverse ? steps - 1 - s : s;
    const long long row = (long long)t * batch + b;
    W gate[4] = {W(0), W(0), W(0), W(0)};
    if (owner)  // read before the barrier: projected is an input
      for (int g = 0; g < 4; ++g) gate[g] = projected[row * 4 * hidden + g * hidden + j];
    const T* h_prev = h0;
    if (s > 0) {
      grid_wait(bar, (unsigned)s * blocks);
      h_prev = hs + (long long)(reverse ? t + 1 : t - 1) * batch * hidden;
    } else {
      __syncthreads();  // us is complete
    }
    rows_to_shared(smem_quads + 8 * hidden, h_prev, row0, batch,
                   hidden);  // us spans 8 * hidden Quads
    __syncthreads();
    W acc[4] = {W(0), W(0), W(0), W(0)};
    for (int k = kh * half; k < (kh + 1) * half; k += 4) {
      const W u0 = us[k * 32 + lane], u1 = us[(k + 1) * 32 + lane], u2 = us[(k + 2) * 32 + lane],
              u3 = us[(k + 3) * 32 + lane];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const Quad<W> h = smem_quads[8 * hidden + ((4 * rg + q) * hidden + k) / 4];
        acc[q] += h.v[0] * u0;
        acc[q] += h.v[1] * u1;
        acc[q] += h.v[2] * u2;
        acc[q] += h.v[3] * u3;
      }
    }
    __syncthreads();  // hsm is read: it becomes red
#pragma unroll
    for (int q = 0; q < 4; ++q) hsm[(kh * 16 + 4 * rg + q) * 32 + lane] = acc[q];
    __syncthreads();
    if (owner) {
      for (int g = 0; g < 4; ++g)
        gate[g] += hsm[r_own * 32 + g * 8 + uu] + hsm[(16 + r_own) * 32 + g * 8 + uu];
      c_carry = lstm_cell(gate, c_carry, row, j, hidden, acts, cs, hs);
    }
    if (s + 1 < steps) grid_arrive(bar);
  }
  grid_exit(bar, blocks);
}

}  // namespace kiln::cuda

#ifdef KILN_LSTM_PERSISTENT_FORWARD
extern "C" __global__ void __launch_bounds__(256)
    KILN_LSTM_PERSISTENT_FORWARD(const KILN_T* __restrict__ projected, const KILN_T* __restrict__ u,
                                 const KILN_T* __restrict__ h0, const KILN_T* __restrict__ c0,
                                 KILN_T* hs, KILN_T* __restrict__ cs, KILN_T* __restrict__ acts,
                                 unsigned* bar, int batch, int hidden, int steps, int reverse) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::lstm_persistent_forward(projected, u, h0, c0, hs, cs, acts, bar, batch, hidden, steps,
                                      reverse);
}
#endif
