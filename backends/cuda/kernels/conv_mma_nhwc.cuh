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
// Two entries (the image's channels-last copy is kernels/nhwc_copy.cuh). KILN_NHWC_WEIGHTS: the
// GEMM's A, W'[m, tap, c] = w[m, c, tap] (forward) or, KILN_FLIP, the input gradient's
// W'[ci, tap, co] = w[co, ci, khkw - 1 - tap] (the flipped, transposed filter; the pass is then
// the forward convolution of dy with it), or its taps by classes of dx's pixels (ConvClasses).
// KILN_CONV_NHWC: the GEMM in tiles of KILN_BM filters by KILN_BN pixels (128 x 64, 64 x 128 or 64
// x 64), 4 warps of (BM / 2) x (BN / 2) each, KILN_DIL 2 reading the image as if dilated by 2
// (grad_input of a stride-2 convolution).
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

// A block's tiles: BM filters and BN pixels by PIECES 16-byte pieces of K a stage, STAGES
// stages, in dynamic shared memory (16-bit units; each row padded by 16 bytes, so that the
// eight rows an ldmatrix reads fall in distinct banks).
template <int BM, int BN, int PIECES, int STAGES>
struct NhwcSmem {
  static constexpr int row = 8 * PIECES + 8;
  static constexpr int a_stage = BM * row, b_stage = BN * row;
  __device__ static unsigned short* a(unsigned short* s, int buf, int r) {
    return s + buf * a_stage + r * row;
  }
  __device__ static unsigned short* b(unsigned short* s, int buf, int r) {
    return s + STAGES * a_stage + buf * b_stage + r * row;
  }
};

template <int STAGES>
__device__ __forceinline__ void cp_async_wait_stages() {
  asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
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
  const T* src = inside ? col.image + ((hs * g.img_w + ws) * channels + p.c) : col.image;
  cp_async16_l1(dst, src, inside ? 16 : 0);
}

// What both stage loaders below share: NT threads load a stage of BM rows of A and BN patch
// columns of PIECES 16-byte pieces each; per thread A_LOADS pieces of A (load_a: rows m0.., K
// rows k0.., past M or, with CHECK_K, past k_end zeros) and one piece of each of COLS columns.
template <typename T, int NT, int PIECES, int BM, int BN>
struct NhwcStageShape {
  static constexpr int E = Bits<T>::piece, STEP = PIECES * E;
  static constexpr int PER_PASS = NT / PIECES, COLS = BN / PER_PASS;  // pixels a pass; a thread's
  static constexpr int A_LOADS = BM * PIECES / NT;
  static_assert(COLS * PER_PASS == BN && A_LOADS * NT == BM * PIECES, "tile and threads");
  template <bool CHECK_K, typename AAt>
  __device__ __forceinline__ static void load_a(const T* __restrict__ w, const ConvGemmShape& g,
                                                int m0, int k0, int k_end, AAt a_at) {
    const int t = threadIdx.x;
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int qa = t + NT * i, row = qa / PIECES, pc = qa % PIECES;
      const int m = m0 + row;
      if constexpr (CHECK_K) {
        const int k = k0 + pc * E;
        const bool in = m < g.m && k < k_end;
        cp_async16(a_at(row, pc), in ? w + (m * g.k + k) : w, in ? 16 : 0);
      } else {
        const bool in = m < g.m;
        cp_async16(a_at(row, pc), w + (in ? m * g.k + k0 + pc * E : 0), in ? 16 : 0);
      }
    }
  }
};

// A block's loads of its K steps, in order (each call of `stage` advances the piece), written
// where a_at(row, piece) and b_at(row, piece) say (the padded tiles here, wgmma's swizzled ones).
template <typename T, int NT, int PIECES, int BM, int BN, int DIL>
struct NhwcStageLoads : NhwcStageShape<T, NT, PIECES, BM, BN> {
  using Shape = NhwcStageShape<T, NT, PIECES, BM, BN>;
  using Shape::COLS, Shape::E, Shape::PER_PASS, Shape::STEP;
  NhwcColumn<T> col[COLS];
  NhwcPiece piece;
  int channels, kh_size;
  __device__ NhwcStageLoads(const T* xt, const ConvGemmShape& g, int n0, int k_begin)
      : channels(g.k / g.khkw), kh_size(g.khkw / g.kw) {
    const int t = threadIdx.x;
#pragma unroll
    for (int j = 0; j < COLS; ++j)
      col[j] = nhwc_column(xt, g, channels, n0 + t / PIECES + PER_PASS * j);
    piece = nhwc_piece(k_begin + (t % PIECES) * E, channels, g.kw);  // K rows (t % PIECES) * E..
  }
  template <typename AAt, typename BAt>
  __device__ __forceinline__ void stage(const T* __restrict__ w, const ConvGemmShape& g, int m0,
                                        int k0, int k_end, AAt a_at, BAt b_at) {
    const int t = threadIdx.x;
    Shape::template load_a<true>(w, g, m0, k0, k_end, a_at);
#pragma unroll
    for (int j = 0; j < COLS; ++j)
      nhwc_load_b<T, DIL>(col[j], g, channels, kh_size, piece,
                          b_at(t / PIECES + PER_PASS * j, t % PIECES));
    nhwc_advance(piece, STEP, channels, g.kw);
  }
};

// Whether every K step of STEP rows lies in one tap (the channels a multiple of STEP) and the
// tap-aligned loads below apply: undilated, at most 32 taps, the image's elements in an int.
__device__ __forceinline__ bool nhwc_taps_aligned(const ConvGemmShape& g, int step) {
  const int channels = g.k / g.khkw;
  const long long elements = (long long)(g.n / g.s_hw) * g.img_h * g.img_w * channels;
  return channels % step == 0 && g.khkw <= 32 && elements < (1ll << 31);
}

// Bits lo..hi-1 of a word, clipped to 0..size-1 (size <= 32).
__device__ __forceinline__ unsigned nhwc_run_bits(int lo, int hi, int size) {
  lo = max(lo, 0);
  hi = min(hi, size);
  if (hi <= lo) return 0u;
  const unsigned below_hi = hi >= 32 ? ~0u : (1u << hi) - 1u;
  return below_hi & ~((1u << lo) - 1u);
}

// NhwcStageLoads's loads where nhwc_taps_aligned holds: a step's tap is the same for every
// column, so a column's piece is its window corner's offset plus the step's (kh, kw, c) offset,
// and whether it lies inside the image one bit of a mask made once per column.
template <typename T, int NT, int PIECES, int BM, int BN>
struct NhwcTapLoads : NhwcStageShape<T, NT, PIECES, BM, BN> {
  using Shape = NhwcStageShape<T, NT, PIECES, BM, BN>;
  using Shape::COLS, Shape::E, Shape::PER_PASS, Shape::STEP;
  const T* xt;
  int corner[COLS];       // (image row h0, column w0) of the window, as an offset into xt
  unsigned inside[COLS];  // bit kh * KW + kw: that tap's pixel lies in the image
  int channels, c, kh, kw, tap, tap_offset;
  __device__ NhwcTapLoads(const T* xt_, const ConvGemmShape& g, int n0, int k_begin)
      : xt(xt_), channels(g.k / g.khkw) {
    const int t = threadIdx.x, kh_size = g.khkw / g.kw;
    tap = k_begin / channels;  // k_begin: a multiple of the step
    c = k_begin - tap * channels;
    kh = tap / g.kw;
    kw = tap - kh * g.kw;
    tap_offset = (kh * g.img_w + kw) * channels;
    // The thread's first column by division, the next ones PER_PASS pixels on by carries.
    int n = n0 + t / PIECES, b = n / g.s_hw, pix = n - b * g.s_hw, oh = pix / g.s_w;
    int ow = pix - oh * g.s_w;
    const int s_h = g.s_hw / g.s_w;
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
      if (j > 0) {
        n += PER_PASS;
        ow += PER_PASS;
        while (ow >= g.s_w) {
          ow -= g.s_w;
          if (++oh == s_h) {
            oh = 0;
            ++b;
          }
        }
      }
      const int h0 = oh * g.stride - g.pad_h, w0 = ow * g.stride - g.pad_w;
      corner[j] = ((b * g.img_h + h0) * g.img_w + w0) * channels;
      inside[j] = 0;
      if (n >= g.n) continue;
      // Taps (i, q) with 0 <= h0 + i < H and 0 <= w0 + q < W: a run of rows, each a run of bits.
      const unsigned row_bits = nhwc_run_bits(-h0, g.img_h - h0, kh_size);
      const unsigned col_bits = nhwc_run_bits(-w0, g.img_w - w0, g.kw);
      for (int i = 0; i < kh_size; ++i)
        if ((row_bits >> i) & 1u) inside[j] |= col_bits << (i * g.kw);
    }
  }
  template <typename AAt, typename BAt>
  __device__ __forceinline__ void stage(const T* __restrict__ w, const ConvGemmShape& g, int m0,
                                        int k0, int k_end, AAt a_at, BAt b_at) {
    const int t = threadIdx.x, pc = t % PIECES, offset = tap_offset + c + pc * E;
    Shape::template load_a<false>(w, g, m0, k0, k_end, a_at);  // (the steps divide K)
    const unsigned bit = 1u << tap;
#pragma unroll
    for (int j = 0; j < COLS; ++j) {
      const bool in = (inside[j] & bit) != 0;
      cp_async16_l1(b_at(t / PIECES + PER_PASS * j, pc), xt + (in ? corner[j] + offset : 0),
                    in ? 16 : 0);
    }
    c += STEP;
    if (c == channels) {  // the next tap
      c = 0;
      ++tap;
      if (++kw == g.kw) {
        kw = 0;
        ++kh;
      }
      tap_offset = (kh * g.img_w + kw) * channels;
    }
  }
};

// The warp's WTM x WTN piece over one stage: K slices of two 16-byte pieces each (16 bf16 K
// rows, or 8 f32), read the same way for either type. The next slice's fragments load before
// this slice's multiplies, so that ldmatrix's latency hides behind them (double-buffered in
// registers; the multiplies keep their order, so the sums their bits).
template <typename T, int BM, int BN, int PIECES, int STAGES, int WTM, int WTN>
__device__ __forceinline__ void nhwc_compute(unsigned short* s, int buf, int wm, int wn,
                                             float (&acc)[WTM / 16][WTN / 8][4]) {
  using L = NhwcSmem<BM, BN, PIECES, STAGES>;
  constexpr int MI = WTM / 16, NJ = WTN / 16;  // A fragments; B ldmatrix_x4 (16 pixels each)
  constexpr int SLICES = PIECES / 2;
  const int lane = threadIdx.x & 31;
  unsigned af[2][MI][4], bf[2][NJ][4];
  auto load = [&](int slice, int r) {
    const int kk = slice * 16;  // in 16-bit units of the rows
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      ldmatrix_x4(af[r][mi], L::a(s, buf, wm * WTM + mi * 16 + lane % 16) + kk + (lane / 16) * 8);
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj)  // matrices (n 0-7, k lo), (n 0-7, k hi), (n 8-15, ...)
      ldmatrix_x4(bf[r][nj], L::b(s, buf, wn * WTN + nj * 16 + lane % 8 + (lane / 16) * 8) + kk +
                                 ((lane / 8) % 2) * 8);
  };
  load(0, 0);
#pragma unroll
  for (int slice = 0; slice < SLICES; ++slice) {
    const int r = slice % 2;
    if (slice + 1 < SLICES) load(slice + 1, 1 - r);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int ni = 0; ni < 2 * NJ; ++ni)
        MmaOp<T>::run(acc[mi][ni], af[r][mi], bf[r][ni / 2][(ni % 2) * 2],
                      bf[r][ni / 2][(ni % 2) * 2 + 1]);
  }
}

// The GEMM of one block: BM x BN of the output, WM x WN warps, K in steps of PIECES pieces.
// SPLIT: blockIdx.z takes the K rows [z * k_chunk, (z + 1) * k_chunk) (k_chunk a multiple of the
// step) and stores f32 partials at y + z * M * N in the output's layout, summed later.
template <typename T, int BM, int BN, int WM, int WN, int PIECES, int STAGES, bool SPLIT,
          typename Loads>
__device__ __forceinline__ void conv_mma_nhwc_with(const T* __restrict__ w,
                                                   const T* __restrict__ xt, T* __restrict__ y,
                                                   const ConvGemmShape& g) {
  using L = NhwcSmem<BM, BN, PIECES, STAGES>;
  constexpr int WTM = BM / WM, WTN = BN / WN;
  constexpr int STEP = Loads::STEP;
  extern __shared__ __align__(16) unsigned short nhwc_smem[];
  unsigned short* s = nhwc_smem;
  const int t = threadIdx.x, warp = t / 32, wm = warp / WN, wn = warp % WN;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = SPLIT ? blockIdx.z * g.k_chunk : 0;
  const int k_end = SPLIT ? min(g.k, k_begin + g.k_chunk) : g.k;
  Loads loads(xt, g, n0, k_begin);
  float acc[WTM / 16][WTN / 8][4];
#pragma unroll
  for (int mi = 0; mi < WTM / 16; ++mi)
#pragma unroll
    for (int ni = 0; ni < WTN / 8; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  const int steps = (k_end - k_begin + STEP - 1) / STEP;
  auto load_stage = [&](int step) {  // in order: each call advances the loads' piece
    const int buf = step % STAGES;
    loads.stage(
        w, g, m0, k_begin + step * STEP, k_end,
        [&](int row, int pc) { return L::a(s, buf, row) + pc * 8; },
        [&](int row, int pc) { return L::b(s, buf, row) + pc * 8; });
  };
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < steps) load_stage(st);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    cp_async_wait_stages<STAGES>();  // this step's stage has landed (for this thread's copies)
    __syncthreads();                 // ... and everyone's; the stage loaded next was read last
    if (step + STAGES - 1 < steps) load_stage(step + STAGES - 1);
    cp_async_commit();
    nhwc_compute<T, BM, BN, PIECES, STAGES, WTM, WTN>(s, step % STAGES, wm, wn, acc);
  }
  if (SPLIT)
    mma_store_c<float, WTM / 16, WTN / 8>(
        reinterpret_cast<float*>(y) + (long long)blockIdx.z * g.m * g.n, g, m0 + wm * WTM,
        n0 + wn * WTN, acc);
  else
    mma_store_c<T, WTM / 16, WTN / 8>(y, g, m0 + wm * WTM, n0 + wn * WTN, acc);
}

// The kernel: the tap-aligned loads where they apply (nhwc_taps_aligned), else the general ones.
template <typename T, int BM, int BN, int WM, int WN, int PIECES, int STAGES, int DIL, bool SPLIT>
__device__ __forceinline__ void conv_mma_nhwc(const T* __restrict__ w, const T* __restrict__ xt,
                                              T* __restrict__ y, const ConvGemmShape& g) {
  constexpr int NT = 32 * WM * WN;
  if constexpr (DIL == 1)
    if (nhwc_taps_aligned(g, PIECES * Bits<T>::piece))
      return conv_mma_nhwc_with<T, BM, BN, WM, WN, PIECES, STAGES, SPLIT,
                                NhwcTapLoads<T, NT, PIECES, BM, BN>>(w, xt, y, g);
  conv_mma_nhwc_with<T, BM, BN, WM, WN, PIECES, STAGES, SPLIT,
                     NhwcStageLoads<T, NT, PIECES, BM, BN, DIL>>(w, xt, y, g);
}

// Filters w[co, ci, tap] in the order a channels-last GEMM reads them (graph/ops.h,
// conv_filter_layout): each copy's a is [rows][khkw][cols], a[r, t, c] = w[r, c, taps.source[t]]
// (the forward: rows = co, cols = ci, the taps in order) or, CHANNELS_MAJOR, w[c, r,
// taps.source[t]] (the input gradient: rows = ci, cols = co, the filter mirrored or its taps by
// classes, conv_params.h's class_source_tap). A block takes one row's columns [c0, c0 + chunk)
// of one copy (blocks from copy.first_block on, chunks of a row in turn): it reads their taps
// into shared memory in the source's order (filters-major: one contiguous run; channels-major: a
// run of khkw per column), then writes the row's taps column-contiguous, so that both sides of
// the transpose are coalesced. A one-dimensional grid; dynamic shared memory the largest chunk *
// khkw elements.
template <typename U, bool CHANNELS_MAJOR>
__device__ __forceinline__ void nhwc_weights(const FilterCopies& copies, const FilterTaps& order) {
  extern __shared__ __align__(16) unsigned char weights_smem[];
  U* taps = reinterpret_cast<U*>(weights_smem);  // [column - c0][tap], as w holds them
  int e = 0;
  while (e + 1 < copies.count && (int)blockIdx.x >= copies.copy[e + 1].first_block) ++e;
  const FilterCopy& f = copies.copy[e];
  const U* __restrict__ w = static_cast<const U*>(f.w);
  U* __restrict__ a = static_cast<U*>(f.a);
  const int rows = f.rows, cols = f.cols, khkw = copies.khkw;
  const int chunks = (cols + f.chunk - 1) / f.chunk, local = blockIdx.x - f.first_block;
  const int r = local / chunks, c0 = (local - r * chunks) * f.chunk, n = min(f.chunk, cols - c0);
  for (int i = threadIdx.x; i < n * khkw; i += blockDim.x) {
    const int cc = i / khkw, tap = i - cc * khkw;
    taps[i] = CHANNELS_MAJOR ? w[((long long)(c0 + cc) * rows + r) * khkw + tap]
                             : w[((long long)r * cols + c0) * khkw + i];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n * khkw; i += blockDim.x) {
    const int tap = i / n, cc = i - tap * n;
    a[((long long)r * khkw + tap) * cols + c0 + cc] = taps[cc * khkw + order.source[tap]];
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_NHWC
extern "C" __global__ void __launch_bounds__(32 * KILN_WM * KILN_WN)
    KILN_CONV_NHWC(const KILN_T* __restrict__ w, const KILN_T* __restrict__ xt,
                   KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_mma_nhwc<KILN_T, KILN_BM, KILN_BN, KILN_WM, KILN_WN, KILN_PIECES, KILN_STAGES,
                            KILN_DIL, KILN_SPLIT>(w, xt, y, g);
}
#endif
#ifdef KILN_NHWC_WEIGHTS
extern "C" __global__ void __launch_bounds__(256)
    KILN_NHWC_WEIGHTS(kiln::cuda::FilterCopies copies, kiln::cuda::FilterTaps taps) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::nhwc_weights<KILN_U, KILN_FLIP>(copies, taps);
}
#endif
