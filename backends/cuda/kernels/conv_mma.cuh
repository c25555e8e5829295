// The tensor-core convolution forward for bf16 and f16 (issue 17; conv.cpp chooses it): the
// implicit GEMM y[co, (b, pix)] = W[co, P] x patches[P, (b, pix)] of conv_igemm.cuh on
// mma.sync m16n8k16 with f32 accumulation. The host defines KILN_T (kiln::cuda::Bf16 or F16),
// KILN_BM (64 or 128 filters a block), KILN_VEC_A (1: every weight row starts 16-byte aligned,
// K % 8 == 0), KILN_FLIP (1: grad_input, the stride-1 convolution of dy with the flipped
// filter, A being the weights transposed to [Cin][Cout][KH][KW]), KILN_DIL (2: grad_input of a
// stride-2 convolution, over dy dilated by 2: taps that meet an inserted zero read nothing)
// and KILN_CONV_MMA, the kernel's name (conv_kernels.cpp).
//
// A block of 2 * BM threads (BM / 32 x 2 warps) computes a BM x 64 tile of C over K in steps
// of 32, double-buffered in shared memory: the weights by cp.async (16-byte pieces, zero-filled
// past M and K; scalar loads when rows are not aligned), the patches gathered by each thread
// into registers (1024 / BM consecutive K rows of one column, so a warp reads 32 adjacent
// pixels of one (c, kh, kw), through a table of each K row's offset and window position that
// the first warp makes two steps ahead) while the tensor cores work on the other buffer. Each
// warp takes a 32 x 32 piece: 2 x 4 mma tiles per 16 K rows, fragments read by ldmatrix (x4
// for A, x4.trans for B from [k][n] rows). Rows of 40 (A) and 72 (B) elements keep ldmatrix
// free of bank conflicts. Each output is rounded once where it is stored; the sum over K is
// in a fixed order.
#pragma once

#include "backends/cuda/kernels/conv_params.h"
#include "backends/cuda/kernels/mma.cuh"
#include "backends/cuda/kernels/storage.cuh"

namespace kiln::cuda {

#define KILN_MMA_BN 64
#define KILN_MMA_BK 32
#define KILN_MMA_OUTSIDE (-30000)      // a table entry that is never inside the image
#define KILN_MMA_AS (KILN_MMA_BK + 8)  // A row length in shared memory (elements)
#define KILN_MMA_BS (KILN_MMA_BN + 8)  // B row length

// The shared tiles of one K step, and the K table of two steps: per K row (c, kh, kw) its
// offset c * H*W + kh * W + kw from a window's corner and (kh, kw), KILN_MMA_OUTSIDE past K.
template <int BM>
struct MmaTiles {
  unsigned short a[2][BM][KILN_MMA_AS];
  unsigned short b[2][KILN_MMA_BK][KILN_MMA_BS];
  int4 ktab[2][KILN_MMA_BK];
};

// FLIP (grad_input): K row k = (c, r') is the filter tap r' of A = the weights transposed to
// [Cin][Cout][KH][KW], which meets the image at the mirrored tap khkw - 1 - r'. DIL 2: the
// offset is the channel's alone; the gather adds the tap's position once it halves it.
template <bool FLIP, int DIL>
__device__ __forceinline__ int4 mma_k_entry(const ConvGemmShape& g, int k) {
  if (k >= g.k) return make_int4(0, KILN_MMA_OUTSIDE, KILN_MMA_OUTSIDE, 0);
  const int c = k / g.khkw, tap = k - c * g.khkw, r = FLIP ? g.khkw - 1 - tap : tap;
  const int kh = r / g.kw, kw = r - kh * g.kw;
  return make_int4(c * g.img_hw + (DIL == 1 ? kh * g.img_w + kw : 0), kh, kw, 0);
}

// This thread's column of the patch matrix: its window's corner (offset, h, w) in the image
// (DIL 2: in the dilated image, the offset the image's alone); a column past N has a corner
// that is never inside.
struct MmaColumn {
  int corner, h0, w0;
};
template <int DIL>
__device__ __forceinline__ MmaColumn mma_column(const ConvGemmShape& g, int n) {
  if (n >= g.n) return MmaColumn{0, KILN_MMA_OUTSIDE, KILN_MMA_OUTSIDE};
  const int b = n / g.s_hw, pix = n - b * g.s_hw, oh = pix / g.s_w, ow = pix - oh * g.s_w;
  const int h0 = oh * g.stride - g.pad_h, w0 = ow * g.stride - g.pad_w;
  return MmaColumn{b * g.img_chw + (DIL == 1 ? h0 * g.img_w + w0 : 0), h0, w0};
}

// B rows kb .. kb + R - 1 of the step's table into registers (zeros outside the image and,
// DIL 2, at the dilated image's inserted zeros: odd rows or columns).
template <int R, int DIL>
__device__ __forceinline__ void mma_gather_b(const unsigned short* __restrict__ img,
                                             const ConvGemmShape& g, const MmaColumn& col,
                                             const int4* ktab, int kb, unsigned short (&rb)[R]) {
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int4 e = ktab[kb + j];
    const int h = col.h0 + e.y, w = col.w0 + e.z;
    if (DIL == 1) {
      const bool inside = (unsigned)h < (unsigned)g.img_h && (unsigned)w < (unsigned)g.img_w;
      rb[j] = inside ? img[col.corner + e.x] : (unsigned short)0;
    } else {
      const int hs = h >> 1, ws = w >> 1;
      const bool inside = ((h | w) & 1) == 0 && (unsigned)hs < (unsigned)g.img_h &&
                          (unsigned)ws < (unsigned)g.img_w;
      rb[j] = inside ? img[col.corner + e.x + hs * g.img_w + ws] : (unsigned short)0;
    }
  }
}

// A rows of the K step at k0: 16-byte cp.async pieces (VEC_A) or 16 scalar loads into ra.
template <int BM, bool VEC_A>
__device__ __forceinline__ void mma_load_a(const unsigned short* __restrict__ w,
                                           const ConvGemmShape& g, int m0, int k0,
                                           unsigned short (*as)[KILN_MMA_AS],
                                           unsigned short (&ra)[16]) {
  constexpr int THREADS = 2 * BM;
  const int t = threadIdx.x;
  if (VEC_A) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = t + THREADS * i, row = q / 4, kc = (q % 4) * 8;
      const int m = m0 + row, k = k0 + kc;
      const bool in = m < g.m && k < g.k;
      cp_async16(&as[row][kc], in ? w + (long long)m * g.k + k : w, in ? 16 : 0);
    }
    cp_async_commit();
    return;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int q = t + THREADS * i, row = q / KILN_MMA_BK, kk = q % KILN_MMA_BK;
    const int m = m0 + row, k = k0 + kk;
    ra[i] = m < g.m && k < g.k ? w[(long long)m * g.k + k] : (unsigned short)0;
  }
}

template <int BM, bool VEC_A, int R>
__device__ __forceinline__ void mma_store_staged(MmaTiles<BM>& s, int buf,
                                                 const unsigned short (&ra)[16],
                                                 const unsigned short (&rb)[R], int kb, int nn) {
  if (!VEC_A)
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int q = threadIdx.x + 2 * BM * i;
      s.a[buf][q / KILN_MMA_BK][q % KILN_MMA_BK] = ra[i];
    }
#pragma unroll
  for (int j = 0; j < R; ++j) s.b[buf][kb + j][nn] = rb[j];
}

// The warp's 32 x 32 piece over one buffer: two 16-row K slices of 2 x 4 mma tiles.
template <typename T, int BM>
__device__ __forceinline__ void mma_compute(const MmaTiles<BM>& s, int buf, int wm, int wn,
                                            float (&acc)[2][4][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KILN_MMA_BK; kk += 16) {
    unsigned af[2][4], bf[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
      ldmatrix_x4(af[mi], &s.a[buf][wm * 32 + mi * 16 + lane % 16][kk + (lane / 16) * 8]);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj)
      ldmatrix_x4_trans(
          bf[nj],
          &s.b[buf][kk + lane % 8 + ((lane / 8) % 2) * 8][wn * 32 + nj * 16 + (lane / 16) * 8]);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
        MmaOp<T>::run(acc[mi][ni], af[mi], bf[ni / 2][(ni % 2) * 2], bf[ni / 2][(ni % 2) * 2 + 1]);
  }
}

// Two adjacent elements of an output row, stored at once: p 4-byte aligned for 16-bit T,
// 8-byte for float.
template <typename T>
struct StorePair {
  __device__ static void run(T* p, float a, float b) {
    const T lo(a), hi(b);
    *reinterpret_cast<unsigned*>(p) = (unsigned)lo.bits | ((unsigned)hi.bits << 16);
  }
};
template <>
struct StorePair<float> {
  __device__ static void run(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
  }
};

// Two values rounded to T, the first in the low half.
template <typename T>
__device__ __forceinline__ unsigned rounded_pair(float a, float b) {
  return static_cast<unsigned>(T(a).bits) | (static_cast<unsigned>(T(b).bits) << 16);
}

// A warp's staging tile for staged_store_c: 8 rows of 64 columns, rows 144 bytes apart (36
// words: a lane's pair of a fragment and a lane's 16 bytes of a row land on distinct banks).
constexpr int kStagePitch = 72;                       // 16-bit units
constexpr int kStageWarpBytes = 8 * kStagePitch * 2;  // conv_tma.h's TmaTile::staging_bytes

// A warp's 16 rows (row0 + lane / 4 and 8 more) by BN columns of y from a wgmma (or mma)
// accumulator (acc[4 j + 2 half + e]: row lane / 4 + 8 half, column 8 j + 2 (lane % 4) + e),
// rounded once as mma_store_c rounds them, through the warp's staging tile: 8 rows of 64
// columns at a time go in as the fragments hold them (a pair of columns a lane) and come out 8
// columns a lane, so that a store instruction writes 4 rows of 128 contiguous bytes (mma_store_c
// writes 8 rows of 16: the short-K passes stored at about 0.5 TB/s). Needs 16-bit T,
// s_hw % 8 == 0 (a lane's 8 columns lie in one image, 16-byte aligned) and y 16-byte aligned.
template <typename T, int BN>
__device__ __forceinline__ void staged_store_c(T* __restrict__ y, const ConvGemmShape& g, int row0,
                                               int n0, const float (&acc)[BN / 2],
                                               unsigned short* stage) {
  const int lane = threadIdx.x & 31, group = lane / 4, tig = lane % 4;
#pragma unroll
  for (int c0 = 0; c0 < BN; c0 += 64)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
#pragma unroll
      for (int jj = 0; jj < 8; ++jj) {
        const int i = 4 * (c0 / 8 + jj) + 2 * half;
        *reinterpret_cast<unsigned*>(stage + group * kStagePitch + jj * 8 + 2 * tig) =
            rounded_pair<T>(acc[i], acc[i + 1]);
      }
      __syncwarp();
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = 4 * i + lane / 8, m = row0 + 8 * half + r;
        const int n = n0 + c0 + (lane % 8) * 8;
        const uint4 v = *reinterpret_cast<const uint4*>(stage + r * kStagePitch + (lane % 8) * 8);
        if (m < g.m && n < g.n) {  // g.n is a multiple of 8: so are the 8 columns
          const int b = n / g.s_hw, pix = n - b * g.s_hw;
          *reinterpret_cast<uint4*>(y + ((long long)b * g.m + m) * g.s_hw + pix) = v;
        }
      }
      __syncwarp();  // the tile is read before the next rows go in
    }
}

// The same 16 rows (filters) by BN columns (pixels) stored channels-last, y[n * g.m + m]
// (graph/ops.h's y_channels_last: the output is [pixels][filters]), rounded as staged_store_c
// rounds them. With `vectors` (g.m % 8 == 0, y 16-byte aligned) through the warp's staging tile
// 16 columns at a time, transposed ([column][16 rows], 512 bytes): a lane then writes 8 rows of
// one column, 16 bytes, and two lanes a column's 32-byte sector (reads conflict-free; the 2-byte
// writes into the tile meet 2-way conflicts); without, each value alone.
template <typename T, int BN>
__device__ __forceinline__ void nhwc_store_c(T* __restrict__ y, const ConvGemmShape& g, int row0,
                                             int n0, const float (&acc)[BN / 2],
                                             unsigned short* stage, bool vectors) {
  const int lane = threadIdx.x & 31, group = lane / 4, tig = lane % 4;
  if (!vectors) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) {
      const int m = row0 + group + 8 * ((i / 2) % 2), n = n0 + 8 * (i / 4) + 2 * tig + i % 2;
      if (m < g.m && n < g.n) y[(long long)n * g.m + m] = T(acc[i]);
    }
    return;
  }
#pragma unroll
  for (int c0 = 0; c0 < BN; c0 += 16) {
#pragma unroll
    for (int jj = 0; jj < 2; ++jj)
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          stage[(jj * 8 + 2 * tig + e) * 16 + 8 * half + group] =
              T(acc[4 * (c0 / 8 + jj) + 2 * half + e]).bits;
    __syncwarp();
    const int col = lane / 2, m = row0 + 8 * (lane % 2), n = n0 + c0 + col;
    const uint4 v = *reinterpret_cast<const uint4*>(stage + col * 16 + 8 * (lane % 2));
    if (m < g.m && n < g.n) *reinterpret_cast<uint4*>(y + (long long)n * g.m + m) = v;
    __syncwarp();  // the tile is read before the next columns go in
  }
}

// Each accumulator of a warp's (16 MI) x (8 NI) piece at (row0, col0) rounded once into
// y[b, m, pix] (n = b * s_hw + pix). A thread's columns are n = col0 + ni * 8 + tig * 2 + e:
// (b, pix) of the first is divided out once and stepped by 8 after; where s_hw is even the
// pair e = 0, 1 lies in one image at an even (aligned) offset and is stored as one.
template <typename T, int MI, int NI>
__device__ __forceinline__ void mma_store_c(T* __restrict__ out, const ConvGemmShape& g, int row0,
                                            int col0, const float (&acc)[MI][NI][4]) {
  const int lane = threadIdx.x & 31, group = lane / 4, tig = lane % 4;
  const bool pairs = g.s_hw % 2 == 0;
  int n = col0 + tig * 2, b = n / g.s_hw, pix = n - b * g.s_hw;
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    if (pairs && n < g.n) {  // n even and g.n even: n + 1 < g.n too
      T* column = out + (long long)b * g.m * g.s_hw + pix;
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int m = row0 + mi * 16 + group + half * 8;
          if (m < g.m)
            StorePair<T>::run(column + (long long)m * g.s_hw, acc[mi][ni][half * 2],
                              acc[mi][ni][half * 2 + 1]);
        }
    } else if (!pairs) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (n + e >= g.n) continue;
        const bool next = e == 1 && pix + 1 == g.s_hw;  // the pair's second opens an image
        T* column = out + (long long)(b + next) * g.m * g.s_hw + (next ? 0 : pix + e);
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int m = row0 + mi * 16 + group + half * 8;
            if (m < g.m) column[(long long)m * g.s_hw] = T(acc[mi][ni][half * 2 + e]);
          }
      }
    }
    n += 8;
    pix += 8;
    while (pix >= g.s_hw) {
      pix -= g.s_hw;
      ++b;
    }
  }
}

template <typename T, int BM, bool VEC_A, bool FLIP, int DIL>
__device__ __forceinline__ void conv_mma_forward(const T* __restrict__ w, const T* __restrict__ x,
                                                 T* __restrict__ y, const ConvGemmShape& g) {
  constexpr int R = 1024 / BM;  // B rows per thread and step
  __shared__ __align__(16) MmaTiles<BM> s;
  const unsigned short* wb = reinterpret_cast<const unsigned short*>(w);
  const unsigned short* xb = reinterpret_cast<const unsigned short*>(x);
  const int t = threadIdx.x, warp = t / 32, wm = warp / 2, wn = warp % 2;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * KILN_MMA_BN;
  const int nn = t % KILN_MMA_BN, kb = (t / KILN_MMA_BN) * R;  // this thread's B column, rows
  const MmaColumn col = mma_column<DIL>(g, n0 + nn);
  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
  unsigned short ra[16], rb[R];
  const int steps = (g.k + KILN_MMA_BK - 1) / KILN_MMA_BK;
  if (t < KILN_MMA_BK) {  // the tables of steps 0 and 1
    s.ktab[0][t] = mma_k_entry<FLIP, DIL>(g, t);
    s.ktab[1][t] = mma_k_entry<FLIP, DIL>(g, KILN_MMA_BK + t);
  }
  __syncthreads();
  mma_load_a<BM, VEC_A>(wb, g, m0, 0, s.a[0], ra);
  mma_gather_b<R, DIL>(xb, g, col, s.ktab[0], kb, rb);
  for (int step = 0; step < steps; ++step) {
    const int buf = step & 1;
    mma_store_staged<BM, VEC_A, R>(s, buf, ra, rb, kb, nn);
    if (VEC_A) cp_async_wait_all();
    __syncthreads();  // this step's tiles are complete; the other buffer's readers are done
    if (step + 1 < steps) {
      const int k0 = (step + 1) * KILN_MMA_BK;
      mma_load_a<BM, VEC_A>(wb, g, m0, k0, s.a[buf ^ 1], ra);
      mma_gather_b<R, DIL>(xb, g, col, s.ktab[buf ^ 1], kb, rb);
    }
    // This step's table was last read before the barrier above: it becomes step + 2's.
    if (t < KILN_MMA_BK) s.ktab[buf][t] = mma_k_entry<FLIP, DIL>(g, (step + 2) * KILN_MMA_BK + t);
    mma_compute<T, BM>(s, buf, wm, wn, acc);
  }
  mma_store_c<T, 2, 4>(y, g, m0 + wm * 32, n0 + wn * 32, acc);
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_MMA
extern "C" __global__ void __launch_bounds__(2 * KILN_BM)
    KILN_CONV_MMA(const KILN_T* __restrict__ w, const KILN_T* __restrict__ x,
                  KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_mma_forward<KILN_T, KILN_BM, KILN_VEC_A, KILN_FLIP, KILN_DIL>(w, x, y, g);
}
#endif
