// The implicit-GEMM convolution kernel of every pass it can run (conv.cpp chooses), one
// kernel per (pass, tile, element types): the host defines KILN_T (the inputs' element type),
// KILN_OT (the output's: KILN_T, or float for bf16/f16 split-K partials), KILN_CONV_IGEMM (the
// kernel's name), KILN_MODE (0 forward, 1 grad_input, 2 grad_weight, 3 grad_input at stride 2
// by classes of dx's pixels), the tile KILN_BM,
// KILN_BN, KILN_KG, KILN_KS, KILN_TM, KILN_TN, the K table's size KILN_TK and the block's
// threads KILN_THREADS (conv_kernels.cpp).
#pragma once

#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

// The implicit GEMM C[M, N] = A[M, K] B[K, N] of one convolution pass (conv_params.h,
// ConvGemmShape). A block computes a BM x BN tile of C over its K range (blockIdx.z's
// k_chunk), KG groups of (BM/TM)(BN/TN) threads, each thread a TM x TN sub-tile (4 or 8 a
// side: 8 is two runs of 4, BM/2 or BN/2 apart, so a warp's shared-memory reads stay
// conflict-free and an 8 x 8 thread does 64 FMAs for 4 128-bit reads, not 16 for 2); a K step
// loads BK = KS*KG rows of A and B into shared memory (double-buffered: the next step's
// global loads are in flight while this step computes) and group q sums rows q*KS.. of it.
// The groups' sums are added in group order at the end, so every result is deterministic.
// B is gathered from the image through two tables of (image offset, h, w, aux) entries,
// one per K index of the current chunk of TK, one per N index of the tile: the element
// exists when (h_k + h_n, w_k + w_n) lies inside the image, at offset off_k + off_n. A is
// read at aux_k + m * a_ms, C written at aux_n + m * c_ms (out + blockIdx.z * M * N for
// split-K partials). Forward and grad_input: N spatial, K patch; grad_weight the reverse.
// Loads along K (all of A, and B in grad_weight) go through 8 (k) x 4 (m or n) blocks per
// warp: 32-byte pieces of memory, and shared-memory stores to 32 distinct banks.
// bf16 and f16 inputs are widened as they are loaded: the tiles in shared memory, the
// products and the sums are float (Wide<T>), and each output is rounded once, where it is
// stored. The forward may add bias[m] (null: none) and apply ReLU (relu) as it stores: the sum
// rounded, then the add and the relu ops' own bits (conv2d_bias's epilogue).
#define KILN_OUTSIDE (-30000)

__device__ __forceinline__ void load4(const float* p, float (&r)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  r[0] = v.x;
  r[1] = v.y;
  r[2] = v.z;
  r[3] = v.w;
}
__device__ __forceinline__ void load4(const double* p, double (&r)[4]) {
  const double2 u = reinterpret_cast<const double2*>(p)[0],
                v = reinterpret_cast<const double2*>(p)[1];
  r[0] = u.x;
  r[1] = u.y;
  r[2] = v.x;
  r[3] = v.y;
}
__device__ __forceinline__ void store4(float* p, const float (&r)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(r[0], r[1], r[2], r[3]);
}
__device__ __forceinline__ void store4(double* p, const double (&r)[4]) {
  reinterpret_cast<double2*>(p)[0] = make_double2(r[0], r[1]);
  reinterpret_cast<double2*>(p)[1] = make_double2(r[2], r[3]);
}
// A 16-bit storage type (Bf16, F16): four rounded values as one 8-byte store.
template <typename OT>
__device__ __forceinline__ void store4(OT* p, const float (&r)[4]) {
  const unsigned b0 = OT(r[0]).bits, b1 = OT(r[1]).bits, b2 = OT(r[2]).bits, b3 = OT(r[3]).bits;
  *reinterpret_cast<uint2*>(p) = make_uint2(b0 | (b1 << 16), b2 | (b3 << 16));
}

// MODE 3's class (blockIdx.z) of dx's pixels (ConvClasses, conv_params.h): where its pixel p
// of the class grid lies in dx, and which tap of the whole filter its tap j is.
struct IgemmClass {
  int out_offset, row_pitch, stride, plane;  // dx's pixels
  int last_tap, filter_khkw, filter_kw;      // the tap of j = 0: (first_kh + s (taps_h - 1), ..)
};

// Spatial index j = (b, oh, ow) of the [B, M, s_hw] tensor (y, dx or dy): the window's
// corner in the image and j's offset in that tensor (MODE 3: j of the class grid, its offset
// in dx). Past `end`: an entry that is never inside.
template <int MODE>
__device__ __forceinline__ int4 spatial_entry(const ConvGemmShape& g, const IgemmClass& cl, int j,
                                              int end) {
  if (j >= end) return make_int4(0, KILN_OUTSIDE, KILN_OUTSIDE, -1);
  const int b = j / g.s_hw, pix = j - b * g.s_hw;
  const int oh = pix / g.s_w, ow = pix - oh * g.s_w;
  const int h = oh * g.stride - g.pad_h, w = ow * g.stride - g.pad_w;
  const int at = MODE == 3 ? b * g.m * cl.plane + cl.out_offset + oh * cl.row_pitch + ow * cl.stride
                           : b * g.m * g.s_hw + pix;
  return make_int4(b * g.img_chw + h * g.img_w + w, h, w, at);
}

// Patch index j = (c, kh, kw): its offset from a window's corner, and aux: j itself (the
// weight's column in forward, dW's column in grad_weight) or, in grad_input, the offset of
// w[c, 0, KH-1-kh, KW-1-kw] (the flipped filter, m = input channel adds m * KH*KW); MODE 3, of
// the class's tap (kh, kw): the filter's tap last_tap - s (kh * filter_kw + kw).
template <int MODE>
__device__ __forceinline__ int4 patch_entry(const ConvGemmShape& g, const IgemmClass& cl, int j,
                                            int end) {
  if (j >= end) return make_int4(0, KILN_OUTSIDE, KILN_OUTSIDE, -1);
  const int c = j / g.khkw, r = j - c * g.khkw;
  const int kh = r / g.kw, kw = r - kh * g.kw;
  const int aux =
      MODE == 1   ? (c * g.m + 1) * g.khkw - 1 - r
      : MODE == 3 ? c * g.m * cl.filter_khkw + cl.last_tap - cl.stride * (kh * cl.filter_kw + kw)
                  : j;
  return make_int4(c * g.img_hw + kh * g.img_w + kw, kh, kw, aux);
}

template <int MODE>
__device__ __forceinline__ int4 k_entry(const ConvGemmShape& g, const IgemmClass& cl, int j,
                                        int end) {
  return MODE == 2 ? spatial_entry<MODE>(g, cl, j, end) : patch_entry<MODE>(g, cl, j, end);
}
template <int MODE>
__device__ __forceinline__ int4 n_entry(const ConvGemmShape& g, const IgemmClass& cl, int j,
                                        int end) {
  return MODE == 2 ? patch_entry<MODE>(g, cl, j, end) : spatial_entry<MODE>(g, cl, j, end);
}

// MODE 3: the pass of class blockIdx.z, a stride-1 convolution of dy over the class grid with
// the class's taps and shift (the host's shape has the whole filter's khkw and K); else `whole`.
template <int MODE>
__device__ __forceinline__ ConvGemmShape class_shape(const ConvGemmShape& whole,
                                                     const ConvClasses& classes, IgemmClass& cl) {
  ConvGemmShape g = whole;
  cl = IgemmClass{};
  if (MODE != 3) return g;
  const int c = blockIdx.z, taps_h = classes.taps_h[c], taps_w = classes.taps_w[c];
  g.khkw = taps_h * taps_w;
  g.kw = taps_w;
  g.pad_h = classes.pad_h[c];
  g.pad_w = classes.pad_w[c];
  g.k = whole.k / whole.khkw * g.khkw;  // (no taps: K = 0, the class's pixels are zeros)
  g.k_chunk = g.k;
  cl.out_offset = classes.out_offset[c];
  cl.row_pitch = classes.row_pitch;
  cl.stride = classes.stride;
  cl.plane = classes.plane;
  cl.filter_khkw = whole.khkw;
  cl.filter_kw = classes.kernel_w;
  cl.last_tap = (classes.first_kh[c] + classes.stride * (taps_h - 1)) * classes.kernel_w +
                classes.first_kw[c] + classes.stride * (taps_w - 1);
  return g;
}

template <typename T, typename OT, int MODE, int BM, int BN, int KG, int KS, int TK, int TM, int TN>
__device__ __forceinline__ void conv_igemm(const T* __restrict__ a_src, const T* __restrict__ img,
                                           OT* __restrict__ out, const ConvGemmShape& whole,
                                           const ConvClasses& classes, const T* __restrict__ bias,
                                           int relu) {
  IgemmClass cl;
  const ConvGemmShape g = class_shape<MODE>(whole, classes, cl);
  typedef typename Wide<T>::type W;
  constexpr int BK = KS * KG, CT = (BM / TM) * (BN / TN), NT = KG * CT, WARPS = NT / 32;
  constexpr int RM = TM / 4,
                RN = TN / 4;  // runs of 4 rows (columns) per thread, BM / RM (BN / RN) apart
  constexpr int A_PER = BM * BK / NT, B_PER = BK * BN / NT;
  constexpr bool K_FAST = MODE == 2;  // B's contiguous axis: K (grad_weight) or N
  static_assert((TM == 4 || TM == 8) && (TN == 4 || TN == 8) && BM % (4 * TM) == 0 &&
                    BN % (4 * TN) == 0 && KS % 16 == 0 && NT % 32 == 0 && NT % BN == 0 &&
                    TK % BK == 0,
                "tile shape");
  static_assert(KG == 1 || (KG - 1) * BM * BN <= 2 * BK * (BM + 4), "group sums must fit in As");
  __shared__ __align__(16) W As[2][BK][BM + 4];
  __shared__ __align__(16) W Bs[2][BK][BN + 4];
  __shared__ int4 ktab[TK];
  __shared__ int4 ntab[BN];

  const int t = threadIdx.x;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int k_begin = MODE == 3 ? 0 : blockIdx.z * g.k_chunk;
  const int k_end = min(g.k, k_begin + g.k_chunk);
  const int grp = t / CT, tc = t - grp * CT, ty = tc / (BN / TN), tx = tc - ty * (BN / TN);
  // This thread's row i and column j of the tile.
  auto row = [&](int i) { return (i / 4) * (BM / RM) + ty * 4 + (i & 3); };
  auto col = [&](int j) { return (j / 4) * (BN / RN) + tx * 4 + (j & 3); };
  // Load j of this thread along K: row (k) and column (m or n) of the 8 x 4 block
  // warp + j * WARPS of the tile's (BK / 8) x (columns / 4) blocks.
  // (When the warps span whole rows of blocks, k does not depend on j: one table entry per step.)
  constexpr unsigned KB = BK / 8;
  auto k_of = [&](int j) -> int {
    const unsigned kb = WARPS % KB == 0 ? warp % KB : (warp + (unsigned)j * WARPS) % KB;
    return (int)(kb * 8 + (lane & 7u));
  };
  auto col_of = [&](int j) -> int {
    const unsigned cb = WARPS % KB == 0 ? warp / KB + (unsigned)j * (WARPS / KB)
                                        : (warp + (unsigned)j * WARPS) / KB;
    return (int)(cb * 4 + (lane >> 3));
  };

  for (int i = t; i < BN; i += NT) ntab[i] = n_entry<MODE>(g, cl, n0 + i, g.n);
  __syncthreads();
  int4 nent[B_PER];  // B load j: (k, n) = (k_of(j), col_of(j)) or (t / BN + j * NT / BN, t % BN)
#pragma unroll
  for (int j = 0; j < B_PER; ++j) nent[j] = ntab[K_FAST ? col_of(j) : t % BN];

  W acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = W(0);
  W ra[A_PER], rb[B_PER];

  auto load_tiles = [&](int step) {
    const int kk0 = step * BK;
#pragma unroll
    for (int j = 0; j < A_PER; ++j) {
      const int aux = ktab[kk0 + k_of(j)].w;
      const int m = m0 + col_of(j);
      ra[j] = aux >= 0 && m < g.m ? W(a_src[aux + m * g.a_ms]) : W(0);
    }
#pragma unroll
    for (int j = 0; j < B_PER; ++j) {
      const int4 ke = ktab[kk0 + (K_FAST ? k_of(j) : t / BN + j * (NT / BN))];
      const int h = ke.y + nent[j].y, w = ke.z + nent[j].z;
      rb[j] = (unsigned)h < (unsigned)g.img_h && (unsigned)w < (unsigned)g.img_w
                  ? W(img[ke.x + nent[j].x])
                  : W(0);
    }
  };
  auto store_tiles = [&](int buf) {
#pragma unroll
    for (int j = 0; j < A_PER; ++j) As[buf][k_of(j)][col_of(j)] = ra[j];
#pragma unroll
    for (int j = 0; j < B_PER; ++j) {
      if (K_FAST)
        Bs[buf][k_of(j)][col_of(j)] = rb[j];
      else
        Bs[buf][t / BN + j * (NT / BN)][t % BN] = rb[j];
    }
  };
  auto compute = [&](int buf) {
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      W a[RM][4], b[RN][4];
#pragma unroll
      for (int r = 0; r < RM; ++r) load4(&As[buf][grp * KS + kk][r * (BM / RM) + ty * 4], a[r]);
#pragma unroll
      for (int r = 0; r < RN; ++r) load4(&Bs[buf][grp * KS + kk][r * (BN / RN) + tx * 4], b[r]);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i / 4][i & 3] * b[j / 4][j & 3];
    }
  };

  for (int c0 = k_begin; c0 < k_end; c0 += TK) {
    const int c1 = min(k_end, c0 + TK);
    const int steps = (c1 - c0 + BK - 1) / BK;
    __syncthreads();  // the previous chunk's last reads of ktab and the tiles are done
    for (int i = t; i < steps * BK; i += NT) ktab[i] = k_entry<MODE>(g, cl, c0 + i, c1);
    __syncthreads();
    load_tiles(0);
    store_tiles(0);
    __syncthreads();
    for (int step = 0; step < steps; ++step) {
      if (step + 1 < steps) load_tiles(step + 1);
      compute(step & 1);
      if (step + 1 < steps) store_tiles((step + 1) & 1);
      __syncthreads();
    }
  }

  if (KG > 1) {  // group 0 adds the other groups' sums, in group order
    W* red = &As[0][0][0];
    __syncthreads();
    if (grp > 0)
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) red[((grp - 1) * BM + row(i)) * BN + col(j)] = acc[i][j];
    __syncthreads();
    if (grp == 0)
      for (int q = 1; q < KG; ++q)
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] += red[((q - 1) * BM + row(i)) * BN + col(j)];
  }
  if (grp != 0) return;
  if (MODE != 3) out += (size_t)blockIdx.z * (size_t)g.m * (size_t)g.n;
#pragma unroll
  for (int r = 0; r < RN;
       ++r) {  // each run of 4 columns: one 4-wide store per row where they are adjacent
    int4 ne[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) ne[j] = ntab[col(r * 4 + j)];
    const bool run =
        ne[0].w >= 0 && ne[3].w == ne[0].w + 3 && ne[1].w == ne[0].w + 1 && ne[2].w == ne[0].w + 2;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int m = m0 + row(i);
      if (m >= g.m) continue;
      OT* dst = out + m * g.c_ms;
      W v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = acc[i][r * 4 + j];
      if (MODE == 0 && bias != nullptr) {  // the forward's epilogue: the bias of filter m
        const W b = static_cast<W>(bias[m]);
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = static_cast<W>(OT(v[j])) + b;
      }
      if (MODE == 0 && relu)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = v[j] > W(0) ? v[j] : W(0);
      if (run && ((size_t)(dst + ne[0].w) & (4 * sizeof(OT) >= 16 ? 15 : 7)) == 0) {
        store4(dst + ne[0].w, v);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (ne[j].w >= 0) dst[ne[j].w] = OT(v[j]);
      }
    }
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_IGEMM
extern "C" __global__ void __launch_bounds__(KILN_THREADS)
    KILN_CONV_IGEMM(const KILN_T* __restrict__ a, const KILN_T* __restrict__ img,
                    KILN_OT* __restrict__ out, kiln::cuda::ConvGemmShape g,
                    kiln::cuda::ConvClasses classes, const KILN_T* __restrict__ bias, int relu) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_igemm<KILN_T, KILN_OT, KILN_MODE, KILN_BM, KILN_BN, KILN_KG, KILN_KS, KILN_TK,
                         KILN_TM, KILN_TN>(a, img, out, g, classes, bias, relu);
}
#endif
