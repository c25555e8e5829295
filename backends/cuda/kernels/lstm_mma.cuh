// The LSTM recurrence of bf16 and f16 on tensor cores (lstm_sequence and lstm_sequence_grad,
// each all steps in one cooperative launch; notes in lstm.h). A block owns 16 hidden units
// (j0 ..) and 16 batch rows (row0 ..), 256 threads; the blocks of one row group (blockIdx.y)
// meet at a barrier between steps (grid_barrier.cuh). Its slice of u stays in shared memory for
// all steps; each step stages the rows it multiplies (h of the step before, or the gate
// gradients of the step processed before) from L2 and multiplies on mma.sync m16n8k16 with f32
// sums. The cell and the carried c (forward) and dc (backward) are f32 registers; h, c, the
// activations and the gate gradients are stored rounded to T once, and the products read them
// as stored. The host defines KILN_T (Bf16 or F16) and the entry it wants as the kernel's name
// (lstm_mma.cpp). Requires H % 16 == 0.
#pragma once

#include "backends/cuda/kernels/grid_barrier.cuh"
#include "backends/cuda/kernels/lstm_cell.cuh"
#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda {

#define LSTM_MMA_THREADS 256

// Rows row0 .. row0 + 15 of a [rows, width] matrix into dst, rows of width + 8 elements (the
// padding puts the 8 rows an ldmatrix reads in different banks), zeros past `rows`; through
// L2 (other blocks wrote them this launch). Committed as one cp.async group. width % 8 == 0.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* src, int row0, int rows, int width) {
  const int pieces = width / 8;
  for (int e = threadIdx.x; e < 16 * pieces; e += LSTM_MMA_THREADS) {
    const int r = e / pieces, p = e % pieces;
    const bool in = row0 + r < rows;
    cp_async16(dst + r * (width + 8) + 8 * p, src + (long long)(in ? row0 + r : 0) * width + 8 * p,
               in ? 16 : 0);
  }
  cp_async_commit();
}

// acc[nt] += A B for a warp: A the 16 staged rows (a, row stride `stride`), B[k][n] = b[n][k]
// for the 16 columns n0 .. n0 + 15 (two n8 tiles, nt = 0, 1), over the K steps of 16 ks0,
// ks0 + kstride, ... below ksteps.
template <typename T>
__device__ __forceinline__ void warp_mma_16x16(float (&acc)[2][4], const T* a, const T* b,
                                               int stride, int n0, int ks0, int kstride,
                                               int ksteps) {
  const int lane = threadIdx.x % 32;
  const T* a_lane = a + (lane % 16) * stride + (lane / 16) * 8;
  const T* b_lane = b + (n0 + (lane / 16) * 8 + lane % 8) * stride + (lane / 8 % 2) * 8;
  for (int ks = ks0; ks < ksteps; ks += kstride) {
    unsigned af[4], bf[4];
    ldmatrix_x4(af, a_lane + 16 * ks);
    ldmatrix_x4(bf, b_lane + 16 * ks);
    MmaOp<T>::run(acc[0], af, bf[0], bf[1]);
    MmaOp<T>::run(acc[1], af, bf[2], bf[3]);
  }
}

// A warp's two 16x8 sums into red[row][n0 + column] (row stride rs).
__device__ __forceinline__ void store_sums(float* red, int rs, int n0, const float (&acc)[2][4]) {
  const int lane = threadIdx.x % 32, row = lane / 4, col = n0 + 2 * (lane % 4);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
    red[row * rs + col + 8 * nt] = acc[nt][0];
    red[row * rs + col + 8 * nt + 1] = acc[nt][1];
    red[(row + 8) * rs + col + 8 * nt] = acc[nt][2];
    red[(row + 8) * rs + col + 8 * nt + 1] = acc[nt][3];
  }
}

// The forward's row stride of the partial gates (64 columns; 80 keeps the two rows a warp's
// cell threads read in different banks).
#define LSTM_MMA_GATE_STRIDE 80

// Shared memory: us[16 g + uu][k] = u[k][g H + j0 + uu] (64 rows), the step's h_prev rows
// (16), both of width H + 8, then the two K halves' partial gates red[kh][r][16 g + uu] (f32).
// Warp w multiplies gate w % 4 (columns 16 (w % 4) ..) over the K steps of parity w / 4;
// thread (r, uu) = (threadIdx.x / 16, threadIdx.x % 16) owns row row0 + r, unit j0 + uu.
template <typename T>
__device__ __forceinline__ void lstm_mma_forward(const T* __restrict__ projected,
                                                 const T* __restrict__ u, const T* __restrict__ h0,
                                                 const T* __restrict__ c0, T* hs,
                                                 T* __restrict__ cs, T* __restrict__ acts,
                                                 unsigned* bar, int batch, int hidden, int steps,
                                                 int reverse) {
  extern __shared__ __align__(16) unsigned char lstm_mma_smem[];
  const int stride = hidden + 8;
  T* us = reinterpret_cast<T*>(lstm_mma_smem);
  T* hsm = us + 64 * stride;
  float* red = reinterpret_cast<float*>(hsm + 16 * stride);
  const int j0 = blockIdx.x * 16, row0 = blockIdx.y * 16;
  const unsigned blocks = gridDim.x;  // of this row group
  bar += 2 * blockIdx.y;
  for (int e = threadIdx.x; e < 64 * hidden; e += LSTM_MMA_THREADS) {
    const int c = e % 64, k = e / 64;
    us[c * stride + k] = u[(long long)k * 4 * hidden + (c / 16) * hidden + j0 + c % 16];
  }
  const int warp = threadIdx.x / 32, r = threadIdx.x / 16, uu = threadIdx.x % 16;
  const int b = row0 + r, j = j0 + uu;
  const bool owner = b < batch;
  float c_carry = owner ? float(c0[(long long)b * hidden + j]) : 0.0f;
  for (int s = 0; s < steps; ++s) {
    const int t = reverse ? steps - 1 - s : s;
    const long long row = (long long)t * batch + b;
    float gate[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (owner)  // read before the barrier: projected is an input
      for (int g = 0; g < 4; ++g) gate[g] = float(projected[row * 4 * hidden + g * hidden + j]);
    const T* h_prev = h0;
    if (s > 0) {
      grid_wait(bar, (unsigned)s * blocks);
      h_prev = hs + (long long)(reverse ? t + 1 : t - 1) * batch * hidden;
    }
    stage_rows(hsm, h_prev, row0, batch, hidden);
    cp_async_wait_all();
    __syncthreads();  // hsm (and, at s = 0, us) complete
    float acc[2][4] = {};
    warp_mma_16x16(acc, hsm, us, stride, 16 * (warp % 4), warp / 4, 2, hidden / 16);
    store_sums(red + (warp / 4) * 16 * LSTM_MMA_GATE_STRIDE, LSTM_MMA_GATE_STRIDE, 16 * (warp % 4),
               acc);
    __syncthreads();
    if (owner) {
      for (int g = 0; g < 4; ++g)
        gate[g] += red[r * LSTM_MMA_GATE_STRIDE + 16 * g + uu] +
                   red[(16 + r) * LSTM_MMA_GATE_STRIDE + 16 * g + uu];
      c_carry = lstm_cell(gate, c_carry, row, j, hidden, acts, cs, hs);
    }
    if (s + 1 < steps) grid_arrive(bar);  // its __syncthreads also guards hsm and red
  }
  grid_exit(bar, blocks);
}

// Shared memory: ut[n][k] = u[j0 + n][k] (16 rows: B = u^T), the gate gradients of the step
// processed before d_next (16 rows), both of width 4H + 8, then the eight warps' partial
// sums red[w][r][n] (f32). Warp w multiplies the K steps w, w + 8, ...; thread (r, uu) owns
// row row0 + r, unit j0 + uu and carries dc. Steps run in the reverse of the processing order;
// after the last one, dh0 = d_next u^T of it and dc0 = the carried dc.
template <typename T>
__device__ __forceinline__ void lstm_mma_backward(
    const T* __restrict__ d_hs, const T* __restrict__ d_cs, const T* __restrict__ u,
    const T* __restrict__ c0, const T* __restrict__ cs, const T* __restrict__ acts, T* d_projected,
    T* __restrict__ dh0, T* __restrict__ dc0, unsigned* bar, int batch, int hidden, int steps,
    int reverse) {
  extern __shared__ __align__(16) unsigned char lstm_mma_smem[];
  const int width = 4 * hidden, stride = width + 8;
  T* ut = reinterpret_cast<T*>(lstm_mma_smem);
  T* dsm = ut + 16 * stride;
  float* red = reinterpret_cast<float*>(dsm + 16 * stride);
  const int j0 = blockIdx.x * 16, row0 = blockIdx.y * 16;
  const unsigned blocks = gridDim.x;
  bar += 2 * blockIdx.y;
  stage_rows(ut, u, j0, hidden, width);  // waited for with the first d_next
  const int warp = threadIdx.x / 32, r = threadIdx.x / 16, uu = threadIdx.x % 16;
  const int b = row0 + r, j = j0 + uu;
  const bool owner = b < batch;
  const long long at0 = (long long)b * hidden + j;
  float dc_carry = 0.0f;
  unsigned waits = 0;
  // s: the processing index of the step, from the last processed; -1: dh0.
  for (int s = steps - 1; s >= -1; --s) {
    const int t = reverse ? steps - 1 - s : s;
    const long long row = (long long)t * batch + b, at = row * hidden + j;
    float act[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c = 0.0f, c_old = 0.0f, dh = 0.0f, dc = 0.0f;
    if (owner && s >= 0) {  // inputs: read before the barrier
      for (int g = 0; g < 4; ++g) act[g] = float(acts[row * 4 * hidden + g * hidden + j]);
      c = float(cs[at]);
      const int t_before = reverse ? t + 1 : t - 1;
      c_old = float(s == 0 ? c0[at0] : cs[((long long)t_before * batch + b) * hidden + j]);
      dh = float(d_hs[at]);
      dc = float(d_cs[at]) + dc_carry;
    }
    if (s + 1 < steps) {  // dh += d_next u^T
      grid_wait(bar, ++waits * blocks);
      const int t_next = reverse ? t - 1 : t + 1;  // the time of processing index s + 1
      stage_rows(dsm, d_projected + (long long)t_next * batch * width, row0, batch, width);
      cp_async_wait_all();
      __syncthreads();
      float acc[2][4] = {};
      warp_mma_16x16(acc, dsm, ut, stride, 0, warp, 8, width / 16);
      store_sums(red + warp * 256, 16, 0, acc);
      __syncthreads();
      if (owner)
        for (int w = 0; w < 8; ++w) dh += red[w * 256 + r * 16 + uu];
    }
    if (s < 0) {
      if (owner) {
        dh0[at0] = T(dh);
        dc0[at0] = T(dc_carry);
      }
      break;
    }
    if (owner) {
      const float i = act[0], f = act[1], g = act[2], o = act[3];
      const float tc = lstm_tanh(c);
      dc += dh * o * (1.0f - tc * tc);
      T* dp = d_projected + row * width + j;
      dp[0] = T(dc * g * i * (1.0f - i));
      dp[hidden] = T(dc * c_old * f * (1.0f - f));
      dp[2 * hidden] = T(dc * i * (1.0f - g * g));
      dp[3 * hidden] = T(dh * tc * o * (1.0f - o));
      dc_carry = dc * f;
    }
    grid_arrive(bar);  // its __syncthreads also guards dsm and red
  }
  grid_exit(bar, blocks);
}

}  // namespace kiln::cuda

#ifdef KILN_LSTM_MMA_FORWARD
extern "C" __global__ void __launch_bounds__(LSTM_MMA_THREADS)
    KILN_LSTM_MMA_FORWARD(const KILN_T* __restrict__ projected, const KILN_T* __restrict__ u,
                          const KILN_T* __restrict__ h0, const KILN_T* __restrict__ c0, KILN_T* hs,
                          KILN_T* __restrict__ cs, KILN_T* __restrict__ acts, unsigned* bar,
                          int batch, int hidden, int steps, int reverse) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::lstm_mma_forward(projected, u, h0, c0, hs, cs, acts, bar, batch, hidden, steps,
                               reverse);
}
#endif

#ifdef KILN_LSTM_MMA_BACKWARD
extern "C" __global__ void __launch_bounds__(LSTM_MMA_THREADS)
    KILN_LSTM_MMA_BACKWARD(const KILN_T* __restrict__ d_hs, const KILN_T* __restrict__ d_cs,
                           const KILN_T* __restrict__ u, const KILN_T* __restrict__ c0,
                           const KILN_T* __restrict__ cs, const KILN_T* __restrict__ acts,
                           KILN_T* d_projected, KILN_T* __restrict__ dh0, KILN_T* __restrict__ dc0,
                           unsigned* bar, int batch, int hidden, int steps, int reverse) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::lstm_mma_backward(d_hs, d_cs, u, c0, cs, acts, d_projected, dh0, dc0, bar, batch,
                                hidden, steps, reverse);
}
#endif
