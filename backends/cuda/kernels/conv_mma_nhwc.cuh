// The tensor-core forward and input gradient of bf16/f16 convolutions over a channels-last
// copy of the image (issue 17; conv.cpp chooses them where the image's channels are a multiple
// of 8): the implicit GEMM y[co, (b, pix)] = W'[co, (kh, kw, c)] x patches[(kh, kw, c), (b, pix)]
// with K ordered tap-major, so that 8 consecutive K rows of a column are 8 channels of one
// pixel: 16 contiguous bytes, loaded by one cp.async. Both operands arrive that way, into
// KILN_NHWC_STAGES buffers in flight; the tensor cores read both K-contiguous tiles with plain
// ldmatrix (a "TN" GEMM).
//
// Three entries. KILN_NHWC_IMAGE: x[b, c, pix] -> xt[b, pix, c] through a 64 x 64 shared tile.
// KILN_NHWC_WEIGHTS: the GEMM's A, W'[m, tap, c] = w[m, c, tap] (forward) or, KILN_FLIP, the
// input gradient's W'[ci, tap, co] = w[co, ci, khkw - 1 - tap] (the flipped, transposed
// filter; the pass is then the forward convolution of dy with it). KILN_CONV_NHWC: the GEMM in
// tiles of KILN_BM filters by KILN_BN pixels by 32 K (64 x 128 or 128 x 64), 4 warps of
// (BM / 2) x (BN / 2) each, KILN_DIL 2 reading the image as if dilated by 2 (grad_input of a
// stride-2 convolution).
//
// Loads, per K step: A's rows by 16-byte pieces, 4 lanes a row (64 contiguous bytes); B's
// pixels the same way, 4 lanes a pixel, through L1, where the pixel's other taps (its
// neighbours' same taps) are read again a few steps later.
#pragma once

#include "backends/cuda/kernels/conv_mma.cuh"
#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/mma.cuh"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

#define KILN_NHWC_BK 32
#define KILN_NHWC_STAGES 3
#define KILN_NHWC_RS (KILN_NHWC_BK + 8)  // row length in shared memory: ldmatrix conflict-free

template <int BM, int BN>
struct NhwcTiles {
  unsigned short a[KILN_NHWC_STAGES][BM][KILN_NHWC_RS];
  unsigned short b[KILN_NHWC_STAGES][BN][KILN_NHWC_RS];
};

__device__ __forceinline__ void cp_async_wait_stages() {
  asm volatile("cp.async.wait_group %0;" ::"n"(KILN_NHWC_STAGES - 2) : "memory");
}

// The next K row this thread loads of its patch columns, as the channel and the tap (kh, kw);
// kh == KH once past K.
struct NhwcPiece {
  int c, kh, kw;
};
__device__ __forceinline__ NhwcPiece nhwc_piece(int k, int channels, int kw_size) {
  const int tap = k / channels;
  return NhwcPiece{k - tap * channels, tap / kw_size, tap - (tap / kw_size) * kw_size};
}
__device__ __forceinline__ void nhwc_advance(NhwcPiece& p, int channels, int kw_size) {
  p.c += KILN_NHWC_BK;
  while (p.c >= channels) {
    p.c -= channels;
    if (++p.kw == kw_size) {
      p.kw = 0;
      ++p.kh;
    }
  }
}

// A patch column (a pixel of the GEMM's N): its window's corner in its image.
struct NhwcColumn {
  const unsigned short* image;  // the column's image (past N: the first, never read)
  int h0, w0;
  bool valid;
};
__device__ __forceinline__ NhwcColumn nhwc_column(const unsigned short* xt, const ConvGemmShape& g,
                                                  int channels, int n) {
  if (n >= g.n) return NhwcColumn{xt, 0, 0, false};
  const int b = n / g.s_hw, pix = n - b * g.s_hw, oh = pix / g.s_w;
  return NhwcColumn{xt + (long long)b * g.img_h * g.img_w * channels, oh * g.stride - g.pad_h,
                    (pix - oh * g.s_w) * g.stride - g.pad_w, true};
}

template <int DIL>
__device__ __forceinline__ void nhwc_load_b(const NhwcColumn& col, const ConvGemmShape& g,
                                            int channels, int kh_size, const NhwcPiece& p,
                                            unsigned short* dst) {
  const int h = col.h0 + p.kh, w = col.w0 + p.kw;
  bool inside = col.valid && p.kh < kh_size;
  int hs = h, ws = w;
  if (DIL == 2) {
    inside = inside && ((h | w) & 1) == 0;
    hs = h >> 1;
    ws = w >> 1;
  }
  inside = inside && (unsigned)hs < (unsigned)g.img_h && (unsigned)ws < (unsigned)g.img_w;
  const unsigned short* src =
      inside ? col.image + ((long long)hs * g.img_w + ws) * channels + p.c : col.image;
  cp_async16_l1(dst, src, inside ? 16 : 0);
}

template <int BM>
__device__ __forceinline__ void nhwc_load_a(const unsigned short* __restrict__ w,
                                            const ConvGemmShape& g, int m0, int k0,
                                            unsigned short (*as)[KILN_NHWC_RS]) {
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int q = threadIdx.x + 128 * i, row = q / 4, kc = (q % 4) * 8;
    const int m = m0 + row, k = k0 + kc;
    const bool in = m < g.m && k < g.k;
    cp_async16(&as[row][kc], in ? w + (long long)m * g.k + k : w, in ? 16 : 0);
  }
}

// The warp's (BM / 2) x (BN / 2) piece over one stage: two 16-row K slices.
template <typename T, int BM, int BN>
__device__ __forceinline__ void nhwc_compute(const NhwcTiles<BM, BN>& s, int buf, int wm, int wn,
                                             float (&acc)[BM / 32][BN / 16][4]) {
  constexpr int MI = BM / 32, NJ = BN / 32;  // A fragments; B ldmatrix_x4 (16 pixels each)
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KILN_NHWC_BK; kk += 16) {
    unsigned af[MI][4], bf[NJ][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      ldmatrix_x4(af[mi], &s.a[buf][wm * (BM / 2) + mi * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)  // matrices (n 0-7, k lo), (n 0-7, k hi), (n 8-15, ...)
      ldmatrix_x4(bf[nj], &s.b[buf][wn * (BN / 2) + nj * 16 + lane % 8 + (lane / 16) * 8]
                              [kk + ((lane / 8) % 2) * 8]);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2 * NJ; ++ni)
        MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
  }
}

template <typename T, int BM, int BN, int DIL>
__device__ __forceinline__ void conv_mma_nhwc(const T* __restrict__ w, const T* __restrict__ xt,
                                              T* __restrict__ y, const ConvGemmShape& g) {
  constexpr int MI = BM / 32, NI = BN / 16, COLS = BN / 32;  // B columns per thread
  __shared__ __align__(16) NhwcTiles<BM, BN> s;
  const unsigned short* wb = reinterpret_cast<const unsigned short*>(w);
  const unsigned short* xb = reinterpret_cast<const unsigned short*>(xt);
  const int t = threadIdx.x, warp = t / 32, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int channels = g.k / g.khkw, kh_size = g.khkw / g.kw;
  const int q = t % 4;  // this thread's 8 K rows of each step: q * 8 ...
  NhwcColumn col[COLS];
#pragma unroll
  for (int j = 0; j < COLS; ++j) col[j] = nhwc_column(xb, g, channels, n0 + t / 4 + 32 * j);
  NhwcPiece piece = nhwc_piece(q * 8, channels, g.kw);
  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  const int steps = (g.k + KILN_NHWC_BK - 1) / KILN_NHWC_BK;
  auto load_stage = [&](int step) {  // the piece advances once per call: stages load in order
    const int buf = step % KILN_NHWC_STAGES;
    nhwc_load_a<BM>(wb, g, m0, step * KILN_NHWC_BK, s.a[buf]);
#pragma unroll
    for (int j = 0; j < COLS; ++j)
      nhwc_load_b<DIL>(col[j], g, channels, kh_size, piece, &s.b[buf][t / 4 + 32 * j][q * 8]);
    nhwc_advance(piece, channels, g.kw);
  };
#pragma unroll
  for (int st = 0; st < KILN_NHWC_STAGES - 1; ++st) {
    if (st < steps) load_stage(st);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    cp_async_wait_stages();  // this step's stage has landed (for this thread's copies)
    __syncthreads();         // ... and everyone's; the stage loaded next was read last step
    if (step + KILN_NHWC_STAGES - 1 < steps) load_stage(step + KILN_NHWC_STAGES - 1);
    cp_async_commit();
    nhwc_compute<T, BM, BN>(s, step % KILN_NHWC_STAGES, wm, wn, acc);
  }
  mma_store_c<T, MI, NI>(y, g, m0 + wm * (BM / 2), n0 + wn * (BN / 2), acc);
}

// xt[b, pix, c] = x[b, c, pix] of images [C][HW] (C even): tiles of 64 channels by 64 pixels
// through shared memory, each thread reading two pixels and writing two channels as one 32-bit
// word (128 contiguous bytes a warp both ways); grid (HW/64, C/64, B), 256 threads.
__device__ __forceinline__ void nchw_to_nhwc(const unsigned short* __restrict__ x,
                                             unsigned short* __restrict__ xt, int channels,
                                             int hw) {
  __shared__ unsigned short tile[64][66];
  const long long image = (long long)blockIdx.z * channels * hw;
  const int p0 = blockIdx.x * 64, c0 = blockIdx.y * 64, lane = threadIdx.x % 32;
  const bool pairs = hw % 2 == 0;  // rows of x start 4-byte aligned
  for (int r = threadIdx.x / 32; r < 64; r += 8) {
    const int c = c0 + r, p = p0 + 2 * lane;
    unsigned short v0 = 0, v1 = 0;
    if (c < channels && pairs && p + 1 < hw) {
      const unsigned v = *reinterpret_cast<const unsigned*>(x + image + (long long)c * hw + p);
      v0 = (unsigned short)(v & 0xffffu);
      v1 = (unsigned short)(v >> 16);
    } else if (c < channels) {
      if (p < hw) v0 = x[image + (long long)c * hw + p];
      if (p + 1 < hw) v1 = x[image + (long long)c * hw + p + 1];
    }
    tile[r][2 * lane] = v0;
    tile[r][2 * lane + 1] = v1;
  }
  __syncthreads();
  for (int r = threadIdx.x / 32; r < 64; r += 8) {
    const int p = p0 + r, c = c0 + 2 * lane;
    if (p >= hw || c >= channels) continue;  // channels even: c + 1 < channels too
    const unsigned v = (unsigned)tile[2 * lane][r] | ((unsigned)tile[2 * lane + 1][r] << 16);
    *reinterpret_cast<unsigned*>(xt + image + (long long)p * channels + c) = v;
  }
}

// The GEMM's A from w[co, ci, tap]: rows of (tap, c) per filter, one thread per element.
template <bool FLIP>
__device__ __forceinline__ void nhwc_weights(const unsigned short* __restrict__ w,
                                             unsigned short* __restrict__ a, int out_channels,
                                             int in_channels, int khkw) {
  const long long total = (long long)out_channels * in_channels * khkw;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    // a is [rows][khkw][cols]: forward rows = co, cols = ci; FLIP rows = ci, cols = co.
    const int cols = FLIP ? out_channels : in_channels;
    const int col = (int)(i % cols), tap = (int)(i / cols % khkw), row = (int)(i / cols / khkw);
    const int co = FLIP ? col : row, ci = FLIP ? row : col;
    const int src_tap = FLIP ? khkw - 1 - tap : tap;
    a[i] = w[((long long)co * in_channels + ci) * khkw + src_tap];
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_NHWC
extern "C" __global__ void __launch_bounds__(128)
    KILN_CONV_NHWC(const KILN_T* __restrict__ w, const KILN_T* __restrict__ xt,
                   KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g) {
  kiln::cuda::conv_mma_nhwc<KILN_T, KILN_BM, KILN_BN, KILN_DIL>(w, xt, y, g);
}
#endif
#ifdef KILN_NHWC_IMAGE
extern "C" __global__ void __launch_bounds__(256)
    KILN_NHWC_IMAGE(const unsigned short* __restrict__ x, unsigned short* __restrict__ xt,
                    int channels, int hw) {
  kiln::cuda::nchw_to_nhwc(x, xt, channels, hw);
}
#endif
#ifdef KILN_NHWC_WEIGHTS
extern "C" __global__ void __launch_bounds__(256)
    KILN_NHWC_WEIGHTS(const unsigned short* __restrict__ w, unsigned short* __restrict__ a,
                      int out_channels, int in_channels, int khkw) {
  kiln::cuda::nhwc_weights<KILN_FLIP>(w, a, out_channels, in_channels, khkw);
}
#endif
