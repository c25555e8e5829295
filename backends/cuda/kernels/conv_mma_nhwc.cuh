// The tensor-core forward and input gradient of bf16/f16 (and, under TF32, f32) convolutions
// over a channels-last copy of the image (issue 17; conv.cpp chooses them where the image's
// channels are a multiple of E = 16 bytes / element: 8, or 4 for f32): the implicit GEMM
// y[co, (b, pix)] = W'[co, (kh, kw, c)] x patches[(kh, kw, c), (b, pix)] with K ordered
// tap-major, so that E consecutive K rows of a column are E channels of one pixel: 16
// contiguous bytes, loaded by one cp.async. A K step is 4 such pieces (64 bytes: 32 bf16 K
// rows, or 16 f32) whatever the type, so the shared tiles and the fragment reads are the same
// bytes; bf16/f16 multiply by m16n8k16, f32 by TF32's m16n8k8 (both in f32). Both operands
// arrive by cp.async into KILN_NHWC_STAGES buffers in flight; the tensor cores read both
// K-contiguous tiles with plain ldmatrix (a "TN" GEMM).
//
// Three entries. KILN_NHWC_IMAGE: x[b, c, pix] -> xt[b, pix, c] through a 64 x 64 shared tile
// (KILN_U: the element's unsigned type). KILN_NHWC_WEIGHTS: the GEMM's A, W'[m, tap, c] =
// w[m, c, tap] (forward) or, KILN_FLIP, the input gradient's W'[ci, tap, co] =
// w[co, ci, khkw - 1 - tap] (the flipped, transposed filter; the pass is then the forward
// convolution of dy with it). KILN_CONV_NHWC: the GEMM in tiles of KILN_BM filters by KILN_BN
// pixels (128 x 64, 64 x 128 or 64 x 64), 4 warps of (BM / 2) x (BN / 2) each, KILN_DIL 2
// reading the image as if dilated by 2 (grad_input of a stride-2 convolution).
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

#define KILN_NHWC_STAGES 3
#define KILN_NHWC_RS \
  40  // row length in 16-bit units: a step's 64 bytes + 16 (ldmatrix: no conflicts)

// Elements per 16-byte piece, and per K step (four pieces).
template <typename T>
struct NhwcElems {
  static constexpr int piece = 16 / sizeof(T), step = 4 * piece;
};

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
__device__ __forceinline__ void nhwc_advance(NhwcPiece& p, int step, int channels, int kw_size) {
  p.c += step;
  while (p.c >= channels) {
    p.c -= channels;
    if (++p.kw == kw_size) {
      p.kw = 0;
      ++p.kh;
    }
  }
}

// A patch column (a pixel of the GEMM's N): its window's corner in its image.
template <typename T>
struct NhwcColumn {
  const T* image;  // the column's image (past N: the first, never read)
  int h0, w0;
  bool valid;
};
template <typename T>
__device__ __forceinline__ NhwcColumn<T> nhwc_column(const T* xt, const ConvGemmShape& g,
                                                     int channels, int n) {
  if (n >= g.n) return NhwcColumn<T>{xt, 0, 0, false};
  const int b = n / g.s_hw, pix = n - b * g.s_hw, oh = pix / g.s_w;
  return NhwcColumn<T>{xt + (long long)b * g.img_h * g.img_w * channels, oh * g.stride - g.pad_h,
                       (pix - oh * g.s_w) * g.stride - g.pad_w, true};
}

template <typename T, int DIL>
__device__ __forceinline__ void nhwc_load_b(const NhwcColumn<T>& col, const ConvGemmShape& g,
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
  const T* src = inside ? col.image + ((long long)hs * g.img_w + ws) * channels + p.c : col.image;
  cp_async16_l1(dst, src, inside ? 16 : 0);
}

template <typename T, int BM>
__device__ __forceinline__ void nhwc_load_a(const T* __restrict__ w, const ConvGemmShape& g, int m0,
                                            int k0, unsigned short (*as)[KILN_NHWC_RS]) {
#pragma unroll
  for (int i = 0; i < BM / 32; ++i) {
    const int q = threadIdx.x + 128 * i, row = q / 4, piece = q % 4;
    const int m = m0 + row, k = k0 + piece * NhwcElems<T>::piece;
    const bool in = m < g.m && k < g.k;
    cp_async16(&as[row][piece * 8], in ? w + (long long)m * g.k + k : w, in ? 16 : 0);
  }
}

// The warp's (BM / 2) x (BN / 2) piece over one stage: two K slices of two 16-byte pieces each
// (16 bf16 K rows, or 8 f32), read the same way for either type.
template <typename T, int BM, int BN>
__device__ __forceinline__ void nhwc_compute(const NhwcTiles<BM, BN>& s, int buf, int wm, int wn,
                                             float (&acc)[BM / 32][BN / 16][4]) {
  constexpr int MI = BM / 32, NJ = BN / 32;  // A fragments; B ldmatrix_x4 (16 pixels each)
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < 32; kk += 16) {  // in 16-bit units of the rows
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
  constexpr int E = NhwcElems<T>::piece, STEP = NhwcElems<T>::step;
  __shared__ __align__(16) NhwcTiles<BM, BN> s;
  const int t = threadIdx.x, warp = t / 32, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int channels = g.k / g.khkw, kh_size = g.khkw / g.kw;
  const int q = t % 4;  // this thread's piece of each step: K rows q * E ...
  NhwcColumn<T> col[COLS];
#pragma unroll
  for (int j = 0; j < COLS; ++j) col[j] = nhwc_column(xt, g, channels, n0 + t / 4 + 32 * j);
  NhwcPiece piece = nhwc_piece(q * E, channels, g.kw);
  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  const int steps = (g.k + STEP - 1) / STEP;
  auto load_stage = [&](int step) {  // the piece advances once per call: stages load in order
    const int buf = step % KILN_NHWC_STAGES;
    nhwc_load_a<T, BM>(w, g, m0, step * STEP, s.a[buf]);
#pragma unroll
    for (int j = 0; j < COLS; ++j)
      nhwc_load_b<T, DIL>(col[j], g, channels, kh_size, piece, &s.b[buf][t / 4 + 32 * j][q * 8]);
    nhwc_advance(piece, STEP, channels, g.kw);
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

// xt[b, pix, c] = x[b, c, pix] of images [C][HW] (C even) of elements U (16 or 32 bits): tiles
// of 64 channels by 64 pixels through shared memory, each thread reading two pixels and
// writing two channels as one pair (128 or 256 contiguous bytes a warp both ways); grid
// (HW/64, C/64, B), 256 threads.
template <typename U>
struct NhwcPair;
template <>
struct NhwcPair<unsigned short> {
  using type = ushort2;
};
template <>
struct NhwcPair<unsigned> {
  using type = uint2;
};

template <typename U>
__device__ __forceinline__ void nchw_to_nhwc(const U* __restrict__ x, U* __restrict__ xt,
                                             int channels, int hw) {
  using Pair = typename NhwcPair<U>::type;
  __shared__ U tile[64][66];
  const long long image = (long long)blockIdx.z * channels * hw;
  const int p0 = blockIdx.x * 64, c0 = blockIdx.y * 64, lane = threadIdx.x % 32;
  const bool pairs = hw % 2 == 0;  // rows of x start pair-aligned
  for (int r = threadIdx.x / 32; r < 64; r += 8) {
    const int c = c0 + r, p = p0 + 2 * lane;
    U v0 = 0, v1 = 0;
    if (c < channels && pairs && p + 1 < hw) {
      const Pair v = *reinterpret_cast<const Pair*>(x + image + (long long)c * hw + p);
      v0 = v.x;
      v1 = v.y;
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
    Pair v;
    v.x = tile[2 * lane][r];
    v.y = tile[2 * lane + 1][r];
    *reinterpret_cast<Pair*>(xt + image + (long long)p * channels + c) = v;
  }
}

// The GEMM's A from w[co, ci, tap]: rows of (tap, c) per filter, one thread per element.
template <typename U, bool FLIP>
__device__ __forceinline__ void nhwc_weights(const U* __restrict__ w, U* __restrict__ a,
                                             int out_channels, int in_channels, int khkw) {
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
    KILN_NHWC_IMAGE(const KILN_U* __restrict__ x, KILN_U* __restrict__ xt, int channels, int hw) {
  kiln::cuda::nchw_to_nhwc<KILN_U>(x, xt, channels, hw);
}
#endif
#ifdef KILN_NHWC_WEIGHTS
extern "C" __global__ void __launch_bounds__(256)
    KILN_NHWC_WEIGHTS(const KILN_U* __restrict__ w, KILN_U* __restrict__ a, int out_channels,
                      int in_channels, int khkw) {
  kiln::cuda::nhwc_weights<KILN_U, KILN_FLIP>(w, a, out_channels, in_channels, khkw);
}
#endif
