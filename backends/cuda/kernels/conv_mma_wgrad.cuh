// The tensor-core weight gradient of bf16 and f16 convolutions, and of f32 ones under TF32
// (issue 17; conv.cpp chooses it): the implicit GEMM dW[co, (c, kh, kw)] = dy[co, (b, pix)] x
// patches[(b, pix), (c, kh, kw)] of conv_igemm.cuh's grad_weight on mma.sync m16n8k16 (bf16,
// f16) or TF32's m16n8k8 (f32), with f32 accumulation. The long K (every
// output pixel of the batch) is split over blockIdx.z in k_chunk pieces whose f32 partials a
// second kernel sums in a fixed order (conv.cuh, splitk_sum), so the result is deterministic.
// The host defines KILN_T (Bf16, F16 or float), KILN_OT (KILN_T, or float for split partials),
// the tile KILN_BM x KILN_BN (filters x patch rows) of KILN_WM x KILN_WN warps over KILN_BK
// pixels a step (32 or 64 16-bit ones; 16 or 32 f32 ones: a step's rows are the same bytes
// whatever the type, and so are the tiles, the threads' loads and the fragment reads; the tiles
// in dynamic shared memory), KILN_VEC_A (1: dy by 16-byte cp.async: OH*OW % 8 == 0, dy
// aligned), KILN_VEC_B (1: the patches by 16-byte loads, below) and KILN_CONV_MMA_WGRAD, the
// kernel's name (conv_kernels.cpp). The tiles keep each element's bits (Bits<T>): E of them
// make a 16-byte piece (8 16-bit elements, 4 f32).
//
// A block of 32 * WM * WN threads computes a BM x BN tile over K steps of BK pixels,
// double-buffered: dy rows by cp.async (or scalar loads), and the patch columns gathered into
// registers while the tensor cores work on the other buffer, each warp a (BM / WM) x (BN / WN)
// piece. Scalar gather: each thread gathers one pixel of the step for BN * BK / threads
// consecutive patch rows (c, kh, kw), so a warp reads 32 (BK 16: 16) adjacent pixels; the rows'
// offsets come from a table the block makes once (its BN patch rows never change). The patches are
// kept as [patch][pixel] rows of BK + E elements, read by ldmatrix without transposition (for
// f32, an 8 x 8 matrix of 16-bit units is 8 rows of 4 elements: thread l receives element (l /
// 4, l % 4), which is TF32's fragment order). VEC_B (stride 1, image and output widths
// multiples of 8, x aligned: E consecutive pixels of a step are then one run of an output row,
// and their patch row reads E consecutive elements of one image row): a thread takes such a
// run of one patch row, loads the two aligned 16-byte pieces of the image row that hold it (a
// piece outside the row is zeros: the row starts and ends on a piece) and shifts them into
// place in registers, so a step's patches cost 2 wide loads a run instead of E scalar ones. Every
// tile sums each dW element over the same K steps in the same order, so tiles and gathers give the
// same bits.
#pragma once

#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/mma.cuh"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

#define KILN_WG_OUTSIDE (-30000)  // a window position that is never inside the image

// Where element (r, c) of a tile of BK-element rows lives: rows padded by 16 bytes (the eight
// rows an ldmatrix reads fall in distinct banks).
template <typename E, int BK>
struct PaddedRows {
  __device__ static E* at(E* tile, int r, int c) { return tile + r * (BK + Bits<E>::piece) + c; }
};

// A block's tiles over BK pixels a step, in dynamic shared memory, rows laid out as PaddedRows.
template <typename E, int BM, int BN, int BK>
struct WgradTiles {
  static constexpr int RS = BK + Bits<E>::piece;
  E a[2][BM][RS];  // dy[m][pixel]
  E b[2][BN][RS];  // patches[(c, kh, kw)][pixel]
  int4 ntab[BN];   // per patch row: c * H*W + kh * W + kw, kh, kw
};

// The tile as compile-time sizes: NT threads, each warp WTM x WTN, G pieces of EP pixels a row
// and step; per thread and step A_LOADS 16-byte pieces of dy (VEC_A) or A_SCALARS elements, and
// RUNS runs (VEC_B) or R patch rows.
template <int BM, int BN, int WM, int WN, int BK, int EP>
struct WgradShape {
  static constexpr int NT = 32 * WM * WN, WTM = BM / WM, WTN = BN / WN, G = BK / EP;
  static constexpr int A_LOADS = BM * G / NT, A_SCALARS = BM * BK / NT;
  static constexpr int RUNS = BN * G / NT, R = BN * BK / NT;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0 && BK % (2 * EP) == 0 && A_LOADS * NT == BM * G &&
                    RUNS * NT == BN * G && NT % BK == 0,
                "wgrad tile");
};

// This thread's pixel k of the step: its window's corner in x, or a corner never inside.
__device__ __forceinline__ int3 wgrad_pixel(const ConvGemmShape& g, int k, int k_end) {
  if (k >= k_end) return make_int3(0, KILN_WG_OUTSIDE, KILN_WG_OUTSIDE);
  const int b = k / g.s_hw, pix = k - b * g.s_hw, oh = pix / g.s_w, ow = pix - oh * g.s_w;
  const int h0 = oh * g.stride - g.pad_h, w0 = ow * g.stride - g.pad_w;
  return make_int3(b * g.img_chw + h0 * g.img_w + w0, h0, w0);
}

template <int R, typename E>
__device__ __forceinline__ void wgrad_gather(const E* __restrict__ x, const ConvGemmShape& g,
                                             int3 px, const int4* ntab, E (&rb)[R]) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int4 e = ntab[j];
    const int h = px.y + e.y, w = px.z + e.z;
    const bool inside = (unsigned)h < (unsigned)g.img_h && (unsigned)w < (unsigned)g.img_w;
    rb[j] = inside ? x[px.x + e.x] : E(0);
  }
}

// VEC_B's runs: a thread's P runs of a step (run q = thread + NT * p: patch row q / G, pixels
// E * (q % G) ...), as the two 16-byte pieces of the image row and the run's offset in them.
template <int P>
struct WgradRuns {
  uint4 lo[P], hi[P];
  int shift[P];
};

template <int NT, int G, int P, typename E>
__device__ __forceinline__ void wgrad_gather_runs(const E* __restrict__ x, const ConvGemmShape& g,
                                                  int k0, int k_end, const int4* ntab,
                                                  WgradRuns<P>& r) {
  constexpr int EP = Bits<E>::piece;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = threadIdx.x + NT * p, k = k0 + (q % G) * EP;
    r.lo[p] = r.hi[p] = make_uint4(0, 0, 0, 0);
    r.shift[p] = 0;
    if (k >= k_end) continue;  // k_end and k are multiples of EP: the run is whole or past K
    const int b = k / g.s_hw, pix = k - b * g.s_hw, oh = pix / g.s_w, ow = pix - oh * g.s_w;
    const int4 e = ntab[q / G];  // c * H*W + kh * W + kw, kh, kw
    const int h = oh - g.pad_h + e.y, w0 = ow - g.pad_w + e.z;
    if ((unsigned)h >= (unsigned)g.img_h) continue;
    const int a0 = w0 & -EP;  // the first piece's column (rounded down, also below 0)
    const long long base =
        (long long)b * g.img_chw + e.x + (oh - g.pad_h) * g.img_w + (ow - g.pad_w) - (w0 - a0);
    r.shift[p] = w0 - a0;
    if (a0 >= 0 && a0 < g.img_w) r.lo[p] = *reinterpret_cast<const uint4*>(x + base);
    if (a0 + EP >= 0 && a0 + EP < g.img_w) r.hi[p] = *reinterpret_cast<const uint4*>(x + base + EP);
  }
}

// Elements s .. s + EP - 1 of the 2 EP in (lo, hi), by selects on the bits of s (no indexing by
// a run-time value, which would put the words in local memory).
template <typename E>
__device__ __forceinline__ uint4 wgrad_shift_run(uint4 lo, uint4 hi, int s) {
  unsigned v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  if (sizeof(E) == 4) s *= 2;  // as 16-bit units
  if (s & 4) {
#pragma unroll
    for (int i = 0; i < 6; ++i) v[i] = v[i + 2];
  }
  if (s & 2) {
#pragma unroll
    for (int i = 0; i < 5; ++i) v[i] = v[i + 1];
  }
  unsigned o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = (s & 1) ? __byte_perm(v[i], v[i + 1], 0x5432) : v[i];
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// The runs into the patch tile b (rows laid out by Layout).
template <int NT, int G, int P, typename Layout, typename E>
__device__ __forceinline__ void wgrad_store_runs(E* b, const WgradRuns<P>& r) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int q = threadIdx.x + NT * p;
    *reinterpret_cast<uint4*>(Layout::at(b, q / G, (q % G) * Bits<E>::piece)) =
        wgrad_shift_run<E>(r.lo[p], r.hi[p], r.shift[p]);
  }
}

// dy rows m0 .. m0 + BM - 1 at pixels k0 .. k0 + BK - 1 (zeros past M and k_end): 16-byte
// cp.async pieces (VEC_A: EP pixels of one image each) into the tile `as` (rows laid out by
// Layout), or scalar loads into ra.
template <int NT, int BM, int BK, int AS, bool VEC_A, typename Layout, typename E>
__device__ __forceinline__ void wgrad_load_a(const E* __restrict__ dy, const ConvGemmShape& g,
                                             int m0, int k0, int k_end, E* as, E (&ra)[AS]) {
  constexpr int EP = Bits<E>::piece;
  const int t = threadIdx.x;
  if (VEC_A) {
#pragma unroll
    for (int i = 0; i < BM * (BK / EP) / NT; ++i) {
      const int q = t + NT * i, row = q / (BK / EP), kc = (q % (BK / EP)) * EP;
      const int m = m0 + row, k = k0 + kc;
      const bool in = m < g.m && k < k_end;
      const int b = k / g.s_hw, pix = k - b * g.s_hw;
      const E* src = dy + ((long long)b * g.m + m) * g.s_hw + pix;
      cp_async16(Layout::at(as, row, kc), in ? src : dy, in ? 16 : 0);
    }
    cp_async_commit();
    return;
  }
#pragma unroll
  for (int i = 0; i < AS; ++i) {
    const int q = t + NT * i, row = q / BK, kk = q % BK;
    const int m = m0 + row, k = k0 + kk;
    const int b = k / g.s_hw, pix = k - b * g.s_hw;
    ra[i] = m < g.m && k < k_end ? dy[((long long)b * g.m + m) * g.s_hw + pix] : E(0);
  }
}

// The scalar loads of a step into the tiles a and b (rows laid out by Layout).
template <int NT, int BK, bool VEC_A, bool VEC_B, int AS, int R, typename Layout, typename E>
__device__ __forceinline__ void wgrad_store_staged(E* a, E* b, const E (&ra)[AS], const E (&rb)[R],
                                                   int nb, int kk) {
  if (!VEC_A)
#pragma unroll
    for (int i = 0; i < AS; ++i) {
      const int q = threadIdx.x + NT * i;
      *Layout::at(a, q / BK, q % BK) = ra[i];
    }
  if (!VEC_B)
#pragma unroll
    for (int j = 0; j < R; ++j) *Layout::at(b, nb + j, kk) = rb[j];
}

// The warp's WTM x WTN piece over one buffer: K slices of 32 bytes (16 16-bit pixels, m16n8k16;
// 8 f32 ones, m16n8k8), whose fragments are read as the same 16-bit matrices.
template <typename T, typename E, int BM, int BN, int BK, int WTM, int WTN>
__device__ __forceinline__ void wgrad_compute(const WgradTiles<E, BM, BN, BK>& s, int buf, int wm,
                                              int wn, float (&acc)[WTM / 16][WTN / 8][4]) {
  constexpr int MI = WTM / 16, NJ = WTN / 16, EP = Bits<E>::piece;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 2 * EP) {
    unsigned af[MI][4], bf[NJ][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      ldmatrix_x4(af[mi], &s.a[buf][wm * WTM + mi * 16 + lane % 16][kk + (lane / 16) * EP]);
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)
      ldmatrix_x4(
          bf[nj],
          &s.b[buf][wn * WTN + nj * 16 + (lane / 16) * 8 + lane % 8][kk + ((lane / 8) % 2) * EP]);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2 * NJ; ++ni)
        MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
  }
}

// The block's table of its patch rows n0 .. n0 + BN - 1: c * H*W + kh * W + kw, kh, kw (past N:
// a window never inside).
template <int NT, int BN>
__device__ __forceinline__ void wgrad_patch_table(int4* ntab, const ConvGemmShape& g, int n0) {
  for (int i = threadIdx.x; i < BN; i += NT) {
    const int n = n0 + i;
    if (n < g.n) {
      const int c = n / g.khkw, r = n - c * g.khkw, kh = r / g.kw, kw = r - kh * g.kw;
      ntab[i] = make_int4(c * g.img_hw + kh * g.img_w + kw, kh, kw, 0);
    } else {
      ntab[i] = make_int4(0, KILN_WG_OUTSIDE, KILN_WG_OUTSIDE, 0);
    }
  }
}

// Each accumulator into out[m, n] (row-major dW, or split z's partials at z * M * N).
template <typename OT, int WTM, int WTN>
__device__ __forceinline__ void wgrad_store_c(OT* __restrict__ out, const ConvGemmShape& g, int m0,
                                              int n0, const float (&acc)[WTM / 16][WTN / 8][4]) {
  const int lane = threadIdx.x & 31, group = lane / 4, tig = lane % 4;
#pragma unroll
  for (int mi = 0; mi < WTM / 16; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int m = m0 + mi * 16 + group + half * 8;
      if (m >= g.m) continue;
      OT* row = out + (long long)m * g.n;
#pragma unroll
      for (int ni = 0; ni < WTN / 8; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int n = n0 + ni * 8 + tig * 2 + e;
          if (n < g.n) row[n] = OT(acc[mi][ni][half * 2 + e]);
        }
    }
}

template <typename T, typename OT, int BM, int BN, int WM, int WN, int BK, bool VEC_A, bool VEC_B>
__device__ __forceinline__ void conv_mma_grad_weight(const T* __restrict__ dy,
                                                     const T* __restrict__ x, OT* __restrict__ out,
                                                     const ConvGemmShape& g) {
  using E = typename Bits<T>::type;
  using S = WgradShape<BM, BN, WM, WN, BK, Bits<E>::piece>;
  constexpr int NT = S::NT, WTM = S::WTM, WTN = S::WTN, G = S::G;
  constexpr int R = VEC_B ? 1 : S::R, P = S::RUNS, AS = VEC_A ? 1 : S::A_SCALARS;
  extern __shared__ __align__(16) unsigned char wgrad_smem[];  // WgradTiles (the host sizes it)
  WgradTiles<E, BM, BN, BK>& s = *reinterpret_cast<WgradTiles<E, BM, BN, BK>*>(wgrad_smem);
  const E* dyb = reinterpret_cast<const E*>(dy);
  const E* xb = reinterpret_cast<const E*>(x);
  const int t = threadIdx.x, warp = t / 32, wm = warp / WN, wn = warp % WN;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * g.k_chunk;
  const int k_end = min(g.k, k_begin + g.k_chunk);
  out += (long long)blockIdx.z * g.m * g.n;
  const int kk = t % BK, nb = (t / BK) * R;  // this thread's pixel, patch rows
  wgrad_patch_table<NT, BN>(s.ntab, g, n0);
  float acc[WTM / 16][WTN / 8][4];
#pragma unroll
  for (int mi = 0; mi < WTM / 16; ++mi)
#pragma unroll
    for (int ni = 0; ni < WTN / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  __syncthreads();
  E ra[AS], rb[R];
  WgradRuns<P> runs;
  auto gather = [&](int k0) {
    if (VEC_B)
      wgrad_gather_runs<NT, G, P>(xb, g, k0, k_end, s.ntab, runs);
    else
      wgrad_gather<R>(xb, g, wgrad_pixel(g, k0 + kk, k_end), s.ntab + nb, rb);
  };
  const int steps = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
  using Layout = PaddedRows<E, BK>;
  if (steps > 0) {
    wgrad_load_a<NT, BM, BK, AS, VEC_A, Layout>(dyb, g, m0, k_begin, k_end, &s.a[0][0][0], ra);
    gather(k_begin);
  }
  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    wgrad_store_staged<NT, BK, VEC_A, VEC_B, AS, R, Layout>(&s.a[buf][0][0], &s.b[buf][0][0], ra,
                                                            rb, nb, kk);
    if (VEC_B) wgrad_store_runs<NT, G, P, Layout>(&s.b[buf][0][0], runs);
    if (VEC_A) cp_async_wait_all();
    __syncthreads();  // this step's tiles are complete; the other buffer's readers are done
    if (step + 1 < steps) {
      const int k0 = k_begin + (step + 1) * BK;
      wgrad_load_a<NT, BM, BK, AS, VEC_A, Layout>(dyb, g, m0, k0, k_end, &s.a[buf ^ 1][0][0], ra);
      gather(k0);
    }
    wgrad_compute<T, E, BM, BN, BK, WTM, WTN>(s, buf, wm, wn, acc);
  }
  wgrad_store_c<OT, WTM, WTN>(out, g, m0 + wm * WTM, n0 + wn * WTN, acc);
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_MMA_WGRAD
extern "C" __global__ void __launch_bounds__(32 * KILN_WM * KILN_WN)
    KILN_CONV_MMA_WGRAD(const KILN_T* __restrict__ dy, const KILN_T* __restrict__ x,
                        KILN_OT* __restrict__ out, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_mma_grad_weight<KILN_T, KILN_OT, KILN_BM, KILN_BN, KILN_WM, KILN_WN, KILN_BK,
                                   KILN_VEC_A, KILN_VEC_B>(dy, x, out, g);
}
#endif
