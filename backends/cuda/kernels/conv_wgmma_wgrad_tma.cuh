// The weight gradient of stride-1 or -2 bf16/f16 convolutions with both operands brought by the
// tensor memory accelerator (sm_90; issue 17): dW[co, (tap, c)] = dy[co, pixels] x
// patches[pixels, (tap, c)], the patch columns tap-major in "atoms" of 64 channels of one tap
// (the image's channels a multiple of 64), K the batch's pixels in steps of 64 that are whole
// output rows of one image or whole images.
//  - A (dy, NCHW) is one 3-D box a step: AR pixels (64, or a whole image of 32 or 16) x BM
//    filters x 64 / AR images, landing as 64 / AR blocks of BM K-major rows of AR pixels in the
//    swizzle of AR * 2 bytes: each k16 slice of the step is 16 pixels of one block. DY_NHWC (dy
//    stored channels-last, [pixels][M]): one 2-D box a warpgroup, 64 filters x the step's 64
//    pixels, wgmma's MN-major A in the 128-byte swizzle (rows of 64 filters, one per pixel, as B
//    lies), so that the same pixels meet in the same order: the same sums.
//  - each atom of B (x's channels-last copy) is one 4-D box, 64 channels x the step's pixels
//    shifted by the atom's tap, every stride-th row and column (zeros outside the image: the
//    padding): rows of 64 channels, one
//    per pixel, wgmma's MN-major B in the 128-byte swizzle; the atoms of a tile lie 8 KiB apart,
//    so one multiply spans them (WIDE: m64n(64 NA)k16, the descriptor's leading offset 8 KiB),
//    or one m64n64k16 per atom.
// f32 under TF32 (BR > 0; wgmma's TF32 reads both operands K-major): a K step is 32 pixels (the
// same 128 bytes a row), A as above with rows of AR f32 pixels, and B from x's tap columns x3
// (x3[b][c][kw][h][j] = x[b][c][h][stride j + kw - pad]: kernels/tap_expand.cuh): each atom's 64
// channels x the step's pixels of one output row (BR of them, BR = min(32, OW): 32 / BR rows a
// step) at the row's own columns (a box's first column on a 16-byte boundary, as the tensor
// memory accelerator requires), the tap's row of x and its copy, one 5-D box a row (zeros
// outside the image), landing as 64 K-major rows of BR pixels in the swizzle of BR * 4 bytes; a
// step's blocks of rows lie [row][atom][64 channels][BR], so that one multiply spans the atoms
// (WIDE) with one stride. Where an image is fewer pixels than a step (OH*OW = BR, 16 or 8, at
// stride 1), a block of rows is a whole image, 32 / BR images a step (A's box as many), and x3
// has KH - 1 zero rows about x's (x3[b][c][kw][h + pad][j]), so that tap kh's pixels of an image
// are one run of x3 from its row kh: one 4-D box (zeros past the batch). Where the output is as
// wide as x at stride 1 (tf32_centre_from_x), the centre tap (kw = pad) is boxed from x itself
// (`centre_map`, the same 5-D box with one tap) and x3 holds the other KW - 1. One producer warp
// (the last) issues a step's copies on the stage's `full` barrier; WM = BM / 64 warpgroups wait,
// multiply and arrive on its `empty` barrier (conv_wgmma_tma.cuh's pipeline). K is split over
// blockIdx.z in k_chunk pieces (whole steps); each split stores its f32 partials in the tile's own
// column order, [split][co][(tap, c)] (8 rows of 32 contiguous bytes a store), and wgrad_tap_sum
// adds the splits into dW's order [co][c][tap].
// HALO = OW (the halo form: a stride-1 3x3 over 64 channels, 64 filters a tile, all nine taps; 0
// off): a step's R = 64 / OW output rows need x's rows oh0 - pad .. oh0 + R + 1 - pad, so B is
// three boxes a step, one a tap column kw (R + 2 rows x OW pixels shifted by kw - pad, zeros
// outside x), each (R + 2) OW rows of 64 channels, and tap (kh, kw)'s operand is box kw from row
// kh OW on (a multiple of 8 rows: the swizzle's period): x's bytes are read 3 (R + 2) / R times a
// step where the nine atoms read them nine times (stage 1 of resnet18, L2-bound: a step's 64
// filters x 192 columns 32 KiB, here 56 KiB for all 576). Three consumer warpgroups, kh each:
// m64n192 over its three boxes (WIDE: the boxes lie B_BOX apart, the descriptor's leading
// offset), A shared.
#pragma once

#include "backends/cuda/kernels/conv_mma.cuh"
#include "backends/cuda/kernels/tma.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

// The 64 patch columns of atom n / 64: channels c.. of tap (kh, kw).
struct TmaAtom {
  int c, tap, kh, kw;
};
__device__ __forceinline__ TmaAtom tma_atom(const ConvGemmShape& g, int channels, int n) {
  const int tap = n / channels, kh = tap / g.kw;
  return TmaAtom{n - tap * channels, tap, kh, tap - kh * g.kw};
}

// The swizzle mode of a descriptor for K-major rows of `bytes` (128, 64 or 32).
__host__ __device__ constexpr unsigned wgrad_swizzle_mode(int bytes) {
  return bytes == 128 ? 1 : bytes == 64 ? 2 : 3;
}

template <typename T, int BM, int NA, int STAGES, int AR, bool WIDE, bool DY_NHWC, int BR,
          int HALO = 0>
__device__ __forceinline__ void conv_wgmma_wgrad_tma(const TmaDescriptor* dy_map,
                                                     const TmaDescriptor* x_map,
                                                     const TmaDescriptor* centre_map,
                                                     float* __restrict__ out,
                                                     const ConvGemmShape& g) {
  constexpr int WM = BM / 64, BN = 64 * NA;
  constexpr int GROUPS = HALO > 0 ? 3 : WM, CONSUMERS = 128 * GROUPS;  // consumer warpgroups
  constexpr int B_BOX = (64 + 2 * HALO) * 64;  // (HALO) a tap column's box of rows, 16-bit units
  constexpr int A_STAGE = BM * 64, B_STAGE = HALO > 0 ? 3 * B_BOX : BN * 64;
  constexpr unsigned STAGE_BYTES = (A_STAGE + B_STAGE) * 2;
  constexpr bool K_MAJOR_B = BR > 0;                               // f32 (TF32): B from NCHW x
  constexpr int STEP = 128 / sizeof(T);                            // a K step's pixels
  constexpr int AU = AR * sizeof(T) / 2, BU = BR * sizeof(T) / 2;  // rows in 16-bit units
  constexpr int SLICES = AU / 16, B_SLICES = BU / 16;              // 32-byte K slices a block holds
  constexpr int B_ROWS = K_MAJOR_B ? STEP / BR : 1;  // B's blocks (output rows) a step
  constexpr unsigned A_SWIZZLE = wgrad_swizzle_mode(AU * 2), B_SWIZZLE = wgrad_swizzle_mode(BU * 2);
  static_assert(BM % 64 == 0 && STAGES >= 2 && (AU == 64 || AU == 32 || AU == 16), "tile");
  static_assert(
      HALO == 0 || (BM == 64 && NA == 9 && sizeof(T) == 2 && HALO % 8 == 0 && 64 % HALO == 0),
      "the halo form: 64 filters by nine taps of 64 channels, 16-bit, whole rows a step");
  static_assert(K_MAJOR_B == (sizeof(T) == 4) && !(K_MAJOR_B && DY_NHWC) &&
                    (!K_MAJOR_B || BU == 64 || BU == 32 || BU == 16),
                "TF32 reads B K-major from NCHW x, dy NCHW");
  extern __shared__ __align__(16) unsigned char wgrad_tma_smem[];
  unsigned short* s = wgmma_tiles(wgrad_tma_smem);
  auto* full = reinterpret_cast<unsigned long long*>(s + STAGES * (A_STAGE + B_STAGE));
  unsigned long long* empty = full + STAGES;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN, channels = g.n / g.khkw;
  const int k_begin = blockIdx.z * g.k_chunk, k_end = min(g.k, k_begin + g.k_chunk);
  const int steps = k_end > k_begin ? (k_end - k_begin + STEP - 1) / STEP : 0;
  out += (long long)blockIdx.z * g.m * g.n;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      mbarrier_init(full + i, 1);
      mbarrier_init(empty + i, CONSUMERS);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= CONSUMERS) {  // the producer warp: one thread issues the copies
    if (threadIdx.x != CONSUMERS) return;
    const bool centre = K_MAJOR_B && tf32_centre_from_x(g);  // kw = pad boxed from x itself
    for (int step = 0; step < steps; ++step) {
      const int buf = step % STAGES, k0 = k_begin + step * STEP;
      const int b = k0 / g.s_hw, pix = k0 - b * g.s_hw, oh0 = pix / g.s_w;
      if (step >= STAGES) mbarrier_wait(empty + buf, (step / STAGES - 1) & 1);
      mbarrier_expect_bytes(full + buf, STAGE_BYTES);
      if constexpr (DY_NHWC) {
#pragma unroll
        for (int h = 0; h < WM; ++h)
          tma_load_2d(s + buf * A_STAGE + h * 64 * 64, dy_map, full + buf, m0 + 64 * h, k0);
      } else {
        tma_load_3d(s + buf * A_STAGE, dy_map, full + buf, pix, m0, b);
      }
      if constexpr (HALO > 0) {  // a box of rows a tap column
#pragma unroll
        for (int kw = 0; kw < 3; ++kw)
          tma_load_4d(s + STAGES * A_STAGE + buf * B_STAGE + kw * B_BOX, x_map, full + buf, 0,
                      kw - g.pad_w, oh0 - g.pad_h, b);
        continue;
      }
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const TmaAtom at = tma_atom(g, channels, n0 + 64 * a);
        unsigned short* b_stage = s + STAGES * A_STAGE + buf * B_STAGE;
        if constexpr (K_MAJOR_B) {
          const int ow0 = pix - oh0 * g.s_w;  // (0 where a step is whole rows)
#pragma unroll
          for (int r = 0; r < B_ROWS; ++r) {
            unsigned short* rows = b_stage + (r * NA + a) * 64 * BU;
            const int row = (oh0 + r) * g.stride + at.kh - g.pad_h;
            if (g.s_hw < STEP)  // whole images: image b + r's run of tap row kh (padded rows)
              tma_load_4d(rows, x_map, full + buf, at.kh * g.s_w, at.kw, at.c, b + r);
            else if (centre && at.kw == g.pad_w)
              tma_load_5d(rows, centre_map, full + buf, ow0, row, 0, at.c, b);
            else
              tma_load_5d(rows, x_map, full + buf, ow0, row,
                          centre && at.kw > g.pad_w ? at.kw - 1 : at.kw, at.c, b);
          }
        } else {
          tma_load_4d(b_stage + a * 64 * 64, x_map, full + buf, at.c, at.kw - g.pad_w,
                      oh0 * g.stride + at.kh - g.pad_h, b);
        }
      }
    }
    return;
  }
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  constexpr int AA = HALO > 0 ? 3 : NA, AN = 64 * AA;  // a warpgroup's atoms and columns
  float acc[AA][32];
#pragma unroll
  for (int a = 0; a < AA; ++a)
#pragma unroll
    for (int r = 0; r < 32; ++r) acc[a][r] = 0.0f;
  for (int step = 0; step < steps; ++step) {
    const int buf = step % STAGES;
    mbarrier_wait(full + buf, (step / STAGES) & 1);
    const unsigned short* a_tile =
        s + buf * A_STAGE + (HALO > 0 ? 0 : group * 64 * (DY_NHWC ? 64 : AU));
    const unsigned short* b_tile = s + STAGES * A_STAGE + buf * B_STAGE;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {  // K slice kk (32 bytes): block kk / SLICES of A; of B
      // (MN-major) rows 16 kk, or (K-major) block kk / B_SLICES
      const unsigned long long a =
          DY_NHWC ? wgmma_descriptor(a_tile + kk * 16 * 64, 16, 1024, 1)
                  : wgmma_descriptor(a_tile + (kk / SLICES) * BM * AU + (kk % SLICES) * 16, 16,
                                     8 * AU * 2, A_SWIZZLE);
      // atom n's descriptor (WIDE: from atom 0, spanning them); HALO: tap (group, n), box n from
      // row group OW
      auto b_at = [&](int n) {
        if constexpr (HALO > 0)
          return wgmma_descriptor(b_tile + n * B_BOX + (group * HALO + kk * 16) * 64,
                                  WIDE ? B_BOX * 2 : 16, 1024, 1);
        return K_MAJOR_B ? wgmma_descriptor(b_tile + (kk / B_SLICES) * BN * BU + n * 64 * BU +
                                                (kk % B_SLICES) * 16,
                                            16, 8 * BU * 2, B_SWIZZLE)
                         : wgmma_descriptor(b_tile + n * 64 * 64 + kk * 16 * 64,
                                            WIDE ? 64 * 64 * 2 : 16, 1024, 1);
      };
      constexpr int TRANS_B = K_MAJOR_B ? 0 : 1, TRANS_A = DY_NHWC ? 1 : 0;
      if (WIDE) {
        Wgmma<T, AN>::template run<TRANS_B, TRANS_A>(*reinterpret_cast<float(*)[AN / 2]>(&acc), a,
                                                     b_at(0));
      } else {
#pragma unroll
        for (int n = 0; n < AA; ++n)
          Wgmma<T, 64>::template run<TRANS_B, TRANS_A>(acc[n], a, b_at(n));
      }
    }
    wgmma_commit();
    wgmma_wait<1>();  // step - 1's multiplies are done: its stage may be loaded again
    wgmma_hold(*reinterpret_cast<float(*)[AN / 2]>(&acc));
    if (step > 0) mbarrier_arrive(empty + (step - 1) % STAGES);
  }
  wgmma_wait<0>();
  wgmma_hold(*reinterpret_cast<float(*)[AN / 2]>(&acc));
  // Register 4 j + e of an atom: row lane / 4 + 8 (e / 2), column 8 j + 2 (lane % 4) + e % 2.
  // (HALO: warpgroup kh's columns are taps 3 kh .. 3 kh + 2, the tile's columns 192 kh on.)
  const int row0 = m0 + (HALO > 0 ? 0 : group * 64) + warp * 16;
  const int col0 = n0 + (HALO > 0 ? group * AN : 0) + 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int m = row0 + lane / 4 + 8 * half;
    if (m >= g.m) continue;
    float* row = out + (long long)m * g.n + col0;
#pragma unroll
    for (int a = 0; a < AA; ++a)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float2*>(row + 64 * a + 8 * j) =
            make_float2(acc[a][4 * j + 2 * half], acc[a][4 * j + 2 * half + 1]);
  }
}

// dW[m, c * khkw + tap] = the sum over the splits, in order, of part[split][m][tap * C + c]: a
// thread a quad of a row's partial columns (tap, c .. c + 3; C a multiple of 64), reading 16
// contiguous bytes of each split and writing its four sums into dW's order, khkw elements apart.
// A row's quads go tap-fastest (quad i: tap i % khkw, channels 4 (i / khkw) ..), so that a warp
// reads runs of whole 32-byte sectors of each tap and writes one run of dW's row (channel-major,
// the taps' sums of a channel together). Where the quads are few for the splits (resnet18's stage
// 1: 64 x 576 columns over 131 splits), `groups` threads share a quad: group g adds splits g, g +
// groups, ..., and the groups' sums are added in group order (the same bits on every run). Blocks
// of 256 threads, 256 / groups quads each. (A block a row's 32 channels through shared memory ran
// resnet18's stage-4 sums of 3 splits at 1.3 TB/s, 8192 blocks of one load each a thread; quads
// in column order wrote dW 2 bytes a 32-byte sector, 39 us against its 26.)
template <typename T>
__device__ __forceinline__ void wgrad_tap_sum(const float* __restrict__ part, T* __restrict__ dw,
                                              int m_count, int n, int khkw, int splits,
                                              int groups) {
  __shared__ float4 group_sums[256];
  const int per = blockDim.x / groups, g = threadIdx.x / per, lane = threadIdx.x - g * per;
  const int row_quads = n / 4, quads = m_count * row_quads, quad = blockIdx.x * per + lane;
  const int channels = n / khkw, m = quad / row_quads, i = quad - m * row_quads;
  const int q = i / khkw, tap = i - q * khkw;
  const float4* p = reinterpret_cast<const float4*>(part + (long long)m * n + tap * channels) + q;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (quad < quads) {
#pragma unroll 4
    for (int z = g; z < splits; z += groups) {
      const float4 v = p[(long long)z * quads];  // (a split's quads)
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
  }
  if (groups > 1) {
    group_sums[threadIdx.x] = sum;
    __syncthreads();
    if (g > 0) return;
    for (int h = 1; h < groups; ++h) {
      const float4 v = group_sums[h * per + lane];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
  }
  if (quad >= quads) return;
  T* out = dw + (long long)m * n + (long long)(4 * q) * khkw + tap;
  out[0] = T(sum.x);
  out[khkw] = T(sum.y);
  out[2 * khkw] = T(sum.z);
  out[3 * khkw] = T(sum.w);
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA_WGRAD_TMA
// (tiles of one warpgroup: two blocks an SM, conv_tma_wgrad_tile_of; the halo form's three
// warpgroups, one)
extern "C" __global__ void __launch_bounds__(KILN_HALO > 0 ? 416 : 128 * (KILN_BM / 64) + 32,
                                             KILN_BM == 64 && KILN_HALO == 0 ? 2 : 1)
    KILN_CONV_WGMMA_WGRAD_TMA(const __grid_constant__ kiln::cuda::TmaDescriptor dy,
                              const __grid_constant__ kiln::cuda::TmaDescriptor xt,
                              const __grid_constant__ kiln::cuda::TmaDescriptor centre,
                              float* __restrict__ out, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_wgmma_wgrad_tma<KILN_T, KILN_BM, KILN_NA, KILN_STAGES, KILN_AR, KILN_WIDE,
                                   KILN_DY_NHWC, KILN_BR, KILN_HALO>(&dy, &xt, &centre, out, g);
}
#endif

#ifdef KILN_WGRAD_TAP_SUM
extern "C" __global__ void __launch_bounds__(256)
    KILN_WGRAD_TAP_SUM(const float* __restrict__ part, KILN_T* __restrict__ dw, int m, int n,
                       int khkw, int splits, int groups) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::wgrad_tap_sum(part, dw, m, n, khkw, splits, groups);
}
#endif
