// The tensor-core weight gradient of bf16 and f16 convolutions (issue 17; conv.cpp chooses it):
// the implicit GEMM dW[co, (c, kh, kw)] = dy[co, (b, pix)] x patches[(b, pix), (c, kh, kw)] of
// conv_igemm.cuh's grad_weight on mma.sync m16n8k16 with f32 accumulation. The long K (every
// output pixel of the batch) is split over blockIdx.z in k_chunk pieces whose f32 partials a
// second kernel sums in a fixed order (conv.cuh, splitk_sum), so the result is deterministic.
// The host defines KILN_T (Bf16 or F16), KILN_OT (KILN_T, or float for split partials), KILN_BM
// (64 or 128 filters a block), KILN_VEC_A (1: dy by 16-byte cp.async: OH*OW % 8 == 0, dy
// aligned) and KILN_CONV_MMA_WGRAD, the kernel's name (conv_kernels.cpp).
//
// A block of 2 * BM threads computes a BM x 64 tile over K steps of 32 pixels, double-buffered:
// dy rows by cp.async (or scalar loads), and the patch columns gathered into registers while the
// tensor cores work on the other buffer. Each thread gathers one pixel of the step for 1024 / BM
// consecutive patch rows (c, kh, kw), so a warp reads 32 adjacent pixels; the rows' offsets
// come from a table the block makes once (its 64 patch rows never change). The patches are
// kept as [patch][pixel] rows of 40 elements, read by ldmatrix without transposition.
#pragma once

#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/mma.cuh"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

#define KILN_WG_BN 64
#define KILN_WG_BK 32
#define KILN_WG_RS (KILN_WG_BK + 8)  // row length of both tiles in shared memory (elements)
#define KILN_WG_OUTSIDE (-30000)     // a window position that is never inside the image

template <int BM>
struct WgradTiles {
  unsigned short a[2][BM][KILN_WG_RS];          // dy[m][pixel]
  unsigned short b[2][KILN_WG_BN][KILN_WG_RS];  // patches[(c, kh, kw)][pixel]
  int4 ntab[KILN_WG_BN];                        // per patch row: c * H*W + kh * W + kw, kh, kw
};

// This thread's pixel k of the step: its window's corner in x, or a corner never inside.
__device__ __forceinline__ int3 wgrad_pixel(const ConvGemmShape& g, int k, int k_end) {
  if (k >= k_end) return make_int3(0, KILN_WG_OUTSIDE, KILN_WG_OUTSIDE);
  const int b = k / g.s_hw, pix = k - b * g.s_hw, oh = pix / g.s_w, ow = pix - oh * g.s_w;
  const int h0 = oh * g.stride - g.pad_h, w0 = ow * g.stride - g.pad_w;
  return make_int3(b * g.img_chw + h0 * g.img_w + w0, h0, w0);
}

template <int R>
__device__ __forceinline__ void wgrad_gather(const unsigned short* __restrict__ x,
                                             const ConvGemmShape& g, int3 px, const int4* ntab,
                                             unsigned short (&rb)[R]) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int4 e = ntab[j];
    const int h = px.y + e.y, w = px.z + e.z;
    const bool inside = (unsigned)h < (unsigned)g.img_h && (unsigned)w < (unsigned)g.img_w;
    rb[j] = inside ? x[px.x + e.x] : (unsigned short)0;
  }
}

// dy rows m0 .. m0 + BM - 1 at pixels k0 .. k0 + 31 (zeros past M and k_end): 16-byte
// cp.async pieces (VEC_A: 8 pixels of one image each) or 16 scalar loads into ra.
template <int BM, bool VEC_A>
__device__ __forceinline__ void wgrad_load_a(const unsigned short* __restrict__ dy,
                                             const ConvGemmShape& g, int m0, int k0, int k_end,
                                             unsigned short (*as)[KILN_WG_RS],
                                             unsigned short (&ra)[16]) {
  constexpr int THREADS = 2 * BM;
  const int t = threadIdx.x;
  if (VEC_A) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = t + THREADS * i, row = q / 4, kc = (q % 4) * 8;
      const int m = m0 + row, k = k0 + kc;
      const bool in = m < g.m && k < k_end;
      const int b = k / g.s_hw, pix = k - b * g.s_hw;
      const unsigned short* src = dy + ((long long)b * g.m + m) * g.s_hw + pix;
      cp_async16(&as[row][kc], in ? src : dy, in ? 16 : 0);
    }
    cp_async_commit();
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int q = t + THREADS * i, row = q / KILN_WG_BK, kk = q % KILN_WG_BK;
    const int m = m0 + row, k = k0 + kk;
    const int b = k / g.s_hw, pix = k - b * g.s_hw;
    ra[i] = m < g.m && k < k_end ? dy[((long long)b * g.m + m) * g.s_hw + pix] : (unsigned short)0;
  }
}

template <int BM, bool VEC_A, int R>
__device__ __forceinline__ void wgrad_store_staged(WgradTiles<BM>& s, int buf,
                                                   const unsigned short (&ra)[16],
                                                   const unsigned short (&rb)[R], int nb, int kk) {
  if (!VEC_A)
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int q = threadIdx.x + 2 * BM * i;
      s.a[buf][q / KILN_WG_BK][q % KILN_WG_BK] = ra[i];
    }
#pragma unroll
  for (int j = 0; j < R; ++j) s.b[buf][nb + j][kk] = rb[j];
}

// The warp's 32 x 32 piece over one buffer: two 16-pixel K slices of 2 x 4 mma tiles.
template <typename T, int BM>
__device__ __forceinline__ void wgrad_compute(const WgradTiles<BM>& s, int buf, int wm, int wn,
                                              float (&acc)[2][4][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KILN_WG_BK; kk += 16) {
    unsigned af[2][4], bf[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
      ldmatrix_x4(af[mi], &s.a[buf][wm * 32 + mi * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
      ldmatrix_x4(
          bf[nj],
          &s.b[buf][wn * 32 + nj * 16 + (lane / 16) * 8 + lane % 8][kk + ((lane / 8) % 2) * 8]);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
        MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
  }
}

// Each accumulator into out[m, n] (row-major dW, or split z's partials at z * M * N).
template <typename OT>
__device__ __forceinline__ void wgrad_store_c(OT* __restrict__ out, const ConvGemmShape& g, int m0,
                                              int n0, int wm, int wn, const float (&acc)[2][4][4]) {
  const int lane = threadIdx.x & 31, group = lane / 4, tig = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + wm * 32 + mi * 16 + group + half * 8;
      if (m >= g.m) continue;
      OT* row = out + (long long)m * g.n;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int n = n0 + wn * 32 + ni * 8 + tig * 2 + e;
          if (n < g.n) row[n] = OT(acc[mi][ni][half * 2 + e]);
        }
    }
}

template <typename T, typename OT, int BM, bool VEC_A>
__device__ __forceinline__ void conv_mma_grad_weight(const T* __restrict__ dy,
                                                     const T* __restrict__ x, OT* __restrict__ out,
                                                     const ConvGemmShape& g) {
  constexpr int R = 1024 / BM;  // patch rows per thread and step
  __shared__ __align__(16) WgradTiles<BM> s;
  const unsigned short* dyb = reinterpret_cast<const unsigned short*>(dy);
  const unsigned short* xb = reinterpret_cast<const unsigned short*>(x);
  const int t = threadIdx.x, warp = t / 32, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * KILN_WG_BN;
  const int k_begin = blockIdx.z * g.k_chunk;
  const int k_end = min(g.k, k_begin + g.k_chunk);
  out += (long long)blockIdx.z * g.m * g.n;
  const int kk = t % KILN_WG_BK, nb = (t / KILN_WG_BK) * R;  // this thread's pixel, patch rows
  if (t < KILN_WG_BN) {
    const int n = n0 + t;
    if (n < g.n) {
      const int c = n / g.khkw, r = n - c * g.khkw, kh = r / g.kw, kw = r - kh * g.kw;
      s.ntab[t] = make_int4(c * g.img_hw + kh * g.img_w + kw, kh, kw, 0);
    } else {
      s.ntab[t] = make_int4(0, KILN_WG_OUTSIDE, KILN_WG_OUTSIDE, 0);
    }
  }
  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  __syncthreads();
  unsigned short ra[16], rb[R];
  const int steps = k_end > k_begin ? (k_end - k_begin + KILN_WG_BK - 1) / KILN_WG_BK : 0;
  if (steps > 0) {
    wgrad_load_a<BM, VEC_A>(dyb, g, m0, k_begin, k_end, s.a[0], ra);
    wgrad_gather<R>(xb, g, wgrad_pixel(g, k_begin + kk, k_end), s.ntab + nb, rb);
  }
  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    wgrad_store_staged<BM, VEC_A, R>(s, buf, ra, rb, nb, kk);
    if (VEC_A) cp_async_wait_all();
    __syncthreads();  // this step's tiles are complete; the other buffer's readers are done
    if (step + 1 < steps) {
      const int k0 = k_begin + (step + 1) * KILN_WG_BK;
      wgrad_load_a<BM, VEC_A>(dyb, g, m0, k0, k_end, s.a[buf ^ 1], ra);
      wgrad_gather<R>(xb, g, wgrad_pixel(g, k0 + kk, k_end), s.ntab + nb, rb);
    }
    wgrad_compute<T, BM>(s, buf, wm, wn, acc);
  }
  wgrad_store_c(out, g, m0, n0, wm, wn, acc);
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_MMA_WGRAD
extern "C" __global__ void __launch_bounds__(2 * KILN_BM)
    KILN_CONV_MMA_WGRAD(const KILN_T* __restrict__ dy, const KILN_T* __restrict__ x,
                        KILN_OT* __restrict__ out, kiln::cuda::ConvGemmShape g) {
  kiln::cuda::conv_mma_grad_weight<KILN_T, KILN_OT, KILN_BM, KILN_VEC_A>(dy, x, out, g);
}
#endif
