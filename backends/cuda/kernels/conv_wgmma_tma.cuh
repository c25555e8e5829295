// The channels-last forward (stride 1 or 2) and stride-1 input gradient of bf16/f16
// convolutions, and of f32 on TF32's tensor cores, with both operands brought by the tensor
// memory accelerator (TMA, sm_90; issue 17): where the image's channels are a multiple of a K
// step's CK (64 16-bit, 32 f32: one 128-byte row), the convolution is undilated and a tile of BN
// output pixels is whole output rows (of one image, or whole images), each K step's B tile (BN
// pixels x CK channels of one tap) is one 4-D box of the NHWC image, [n][h][w][c], shifted by
// the tap: rows stride oh + kh - pad_h, columns stride ow + kw - pad_w (every stride-th row and
// column: the map's element strides; the TMA fills what lies outside the image with zeros, the
// padding). A's CK-element K slice of BM filter rows is one 2-D box. Both land K-major in
// wgmma's 128-byte swizzle, which is the TMA's 128-byte swizzle, as TF32's wgmma reads them too
// (four k8 slices a row where 16-bit takes four k16). TF32 stores from the fragments, one class,
// no moments.
//
// One producer warp (the last) issues a step's two copies on the stage's `full` barrier (which
// completes when their bytes have arrived); WM warpgroups (BM = 64 WM) multiply, 64 filters by
// BN pixels each, and arrive on the stage's `empty` barrier when their multiplies are done. The
// consumers' K loop is a wait, four wgmma and an arrive: no address arithmetic at all.
// The sums are those of conv_wgmma.cuh (the same K steps in the same order): the same bits.
//
// NC 4 (the input gradient of a stride-2 convolution by classes of dx's pixels, ConvClasses in
// conv_params.h): a tile is BN pixels of the class grid (H / 2 x W / 2), and its K loop runs
// the four classes one after another, each over its own taps of the filter (A's columns
// class-major) and its own shift of dy's box; a class (rh, 0)'s sums wait, rounded, in registers
// until (rh, 1)'s are done, and the two are stored together into row 2 row + rh of dx, four
// adjacent columns at once. Every tile has all of K's steps, so the stages turn as in the plain
// pass. The sums are those of the dilated pass (conv_wgmma.cuh, KILN_DIL 2) without the steps
// that multiply the zeros between dy's pixels: the same bits.
//
// SPLIT 2 (one team only; a launch of clusters of two blocks, a tile each): where the tiles are
// too few for the SMs, the cluster's two blocks take the two halves of a tile's K steps; the
// second then writes its sums into the first's (idle) stage memory, and the first adds them to
// its own (first half + second half, a fixed order) and stores the tile.
#pragma once

#include "backends/cuda/kernels/conv_mma.cuh"
#include "backends/cuda/kernels/tma.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

// conv2d_moments' epilogue (graph/ops.h): the run moments of one warp's 16 filters (rows row0
// + lane / 4 and 8 more) over a tile's BN pixels from n0, in wgmma's accumulator layout (column
// block i of 8: columns 8 i + 2 (lane % 4) + {0, 1}, acc[4 i + 2 half + e]). Each run of 64
// pixels is 16 values a thread a row over the 4 lanes of a row: its mean, then the squared
// deviations from it, both over the values as stored (rounded to T), summed over the lanes by
// shuffles; the row's first lane writes the count, mean and squares into moments [3, runs, M]
// (the 8 rows of a warp's half: 32 contiguous bytes).
template <typename T, int BN>
__device__ __forceinline__ void store_run_moments(float* __restrict__ moments,
                                                  const ConvGemmShape& g, int row0, int n0,
                                                  const float (&acc)[BN / 2]) {
  const int lane = threadIdx.x & 31, tig = lane & 3;
  const int runs = (g.n + 63) / 64;
#pragma unroll
  for (int j = 0; j < BN / 64; ++j) {
    const int first = n0 + 64 * j;
    if (first >= g.n) break;  // the same for the whole warp
    const int count = min(64, g.n - first);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float v[16], sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool inside = 8 * i + 2 * tig + e < count;
          v[2 * i + e] = inside ? static_cast<float>(T(acc[4 * (8 * j + i) + 2 * half + e])) : 0.0f;
          sum += v[2 * i + e];
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const float mean = sum / static_cast<float>(count);
      float squares = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float d = 8 * i + 2 * tig + e < count ? v[2 * i + e] - mean : 0.0f;
          squares += d * d;
        }
      squares += __shfl_xor_sync(0xffffffffu, squares, 1);
      squares += __shfl_xor_sync(0xffffffffu, squares, 2);
      const int m = row0 + lane / 4 + 8 * half;
      if (tig == 0 && m < g.m) {
        const long long at = static_cast<long long>(first / 64) * g.m + m;
        const long long plane = static_cast<long long>(g.m) * runs;
        moments[at] = static_cast<float>(count);
        moments[plane + at] = mean;
        moments[2 * plane + at] = squares;
      }
    }
  }
}

// Two classes' tiles of dx (ConvClasses, stride 2), (rh, 0) and (rh, 1), of one warp's 16 rows
// (row0 + lane / 4 and 8 more) over BN pixels of the class grid from n0, in wgmma's accumulator
// layout: the first's sums already rounded in pairs (`first[2 i + half]`: column block i, its
// columns e = 0, 1), the second's in `acc`. A thread's class pixels (row, col) and (row, col + 1)
// are dx's columns 2 col .. 2 col + 3 of row 2 row + rh: one 8-byte store of the four values
// (col even; dx's width a multiple of 4), so that each row's 4 lanes write one 32-byte sector;
// NHWC (dx stored channels-last, dx[(b plane + pixel) * g.m + m]): the four values each alone,
// a warp's store writing 8 filters (16 bytes) of 4 pixels.
template <typename T, int BN, bool NHWC>
__device__ __forceinline__ void store_class_pair(T* __restrict__ dx, const ConvGemmShape& g,
                                                 const ConvClasses& cl, int rh, int row0, int n0,
                                                 const unsigned (&first)[BN / 4],
                                                 const float (&acc)[BN / 2]) {
  const int lane = threadIdx.x & 31, tig = lane & 3, s_h = g.s_hw / g.s_w;
  int n = n0 + 2 * tig, b = n / g.s_hw, pix = n - b * g.s_hw;
  int row = pix / g.s_w, col = pix - row * g.s_w;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    if (n < g.n) {  // (n even, g.n even: n + 1 too)
      const long long image = static_cast<long long>(b) * cl.plane;  // (NCHW: times g.m)
      const long long pixel = cl.out_offset[2 * rh] + row * cl.row_pitch + 2 * col;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int m = row0 + lane / 4 + 8 * half;
        if (m >= g.m) continue;
        const unsigned f = first[2 * i + half];
        const unsigned second = rounded_pair<T>(acc[4 * i + 2 * half], acc[4 * i + 2 * half + 1]);
        const unsigned lo = (f & 0xffffu) | (second << 16), hi = (f >> 16) | (second & 0xffff0000u);
        if constexpr (NHWC) {
          auto* at = reinterpret_cast<unsigned short*>(dx) + (image + pixel) * g.m + m;
          at[0] = static_cast<unsigned short>(lo);
          at[g.m] = static_cast<unsigned short>(lo >> 16);
          at[2 * g.m] = static_cast<unsigned short>(hi);
          at[3 * g.m] = static_cast<unsigned short>(hi >> 16);
        } else {
          *reinterpret_cast<uint2*>(dx + image * g.m + static_cast<long long>(m) * cl.plane +
                                    pixel) = make_uint2(lo, hi);
        }
      }
    }
    n += 8;
    col += 8;
    while (col >= g.s_w) {
      col -= g.s_w;
      if (++row == s_h) {
        row = 0;
        ++b;
      }
    }
  }
}

// y = W' x patches (conv_wgmma.cuh's GEMM) over `image` (the NHWC image's box map: channels,
// columns, rows, images; boxes of 64 x s_w x rows x images = BN pixels) and `filters` (A's map:
// K, M; boxes of 64 x BM). The tiles (N fastest) are dealt out to the blocks in turn
// (t = blockIdx.x, + gridDim.x, ...): one each where the grid is the tile count, several where
// it is persistent. TEAMS teams of WM warpgroups take a block's tiles in turn; with two, the
// teams' K loops run one after the other (the `turn` barriers hand the loop over: a team waits
// for the other's K loop, not its epilogue), so that one team's epilogue overlaps the other's
// multiplies, and a team never waits on a stage's barrier before the fill ahead of its own has
// landed (a parity wait cannot tell two fills apart).
// MOMENTS: the epilogue also writes conv2d_moments' run moments (store_run_moments). NC: 1, or
// 4 classes of dx's pixels (`classes`; the header). staging: 1, the plain store goes through each
// warp's staging tile (staged_store_c) where the shape allows; 2, y is stored channels-last
// (nhwc_store_c, store_class_pair's NHWC; no moments: the host asks it only so); 0, from the
// fragments.
template <typename T, int BM, int BN, int STAGES, int TEAMS, int SPLIT, bool MOMENTS, int NC>
__device__ __forceinline__ void conv_wgmma_tma(const TmaDescriptor* filters,
                                               const TmaDescriptor* image, T* __restrict__ y,
                                               float* __restrict__ moments, const ConvGemmShape& g,
                                               const ConvClasses& classes, int staging) {
  constexpr int WM = BM / 64, TEAM = 128 * WM, CONSUMERS = TEAM * TEAMS;
  constexpr int A_STAGE = BM * 64, B_STAGE = BN * 64;  // 16-bit units
  constexpr unsigned STAGE_BYTES = (A_STAGE + B_STAGE) * 2;
  constexpr int CK = 128 / sizeof(T);  // a K step's channels (one 128-byte row)
  static_assert(BM % 64 == 0 && STAGES >= 2 && (TEAMS == 1 || TEAMS == 2), "tile and stages");
  static_assert(sizeof(T) == 2 || (NC == 1 && !MOMENTS), "TF32: one class, no moments");
  static_assert(
      SPLIT == 1 || (SPLIT == 2 && TEAMS == 1 && STAGES * STAGE_BYTES >= CONSUMERS * (BN / 2) * 4u),
      "a split tile: one team, and the second half's sums fit the stages");
  static_assert(NC == 1 || (NC == 4 && SPLIT == 1 && !MOMENTS), "classes: K whole, no moments");
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  unsigned short* s = wgmma_tiles(wgmma_smem);
  auto* full = reinterpret_cast<unsigned long long*>(s + STAGES * (A_STAGE + B_STAGE));
  unsigned long long* empty = full + STAGES;
  unsigned long long* turn = empty + STAGES;  // turn[team]: the other team's K loop is done
  // Each consumer warp's staging tile (staged_store_c), after the barriers.
  unsigned short* stage =
      reinterpret_cast<unsigned short*>(turn + 2) + (threadIdx.x / 32) * (kStageWarpBytes / 2);
  const bool aligned = (reinterpret_cast<unsigned long long>(y) & 15ull) == 0ull;
  const bool staged = sizeof(T) == 2 && staging == 1 && g.s_hw % 8 == 0 && aligned;
  const bool nhwc = sizeof(T) == 2 && staging == 2, nhwc_vectors = g.m % 8 == 0 && aligned;
  const int channels = g.k / g.khkw, all_steps = g.k / CK;
  const int n_tiles = (g.n + BN - 1) / BN, tiles = n_tiles * ((g.m + BM - 1) / BM);
  // This block's K steps of each of its tiles: all, or (SPLIT 2) its rank's half.
  const int rank = SPLIT > 1 ? static_cast<int>(cluster_rank()) : 0;
  const int first_step = all_steps * rank / SPLIT;
  const int steps = all_steps * (rank + 1) / SPLIT - first_step;
  const int first_tile = static_cast<int>(blockIdx.x) / SPLIT, tile_stride = gridDim.x / SPLIT;
  if (threadIdx.x == 0) {
    for (int i = 0; i < STAGES; ++i) {
      mbarrier_init(full + i, 1);
      mbarrier_init(empty + i, TEAM);
    }
    mbarrier_init(turn, TEAM);
    mbarrier_init(turn + 1, TEAM);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= CONSUMERS) {  // the producer warp: one thread issues the copies
    if (threadIdx.x != CONSUMERS) return;
    int gstep = 0;  // the block's steps, over its tiles
    for (int t = first_tile; t < tiles; t += tile_stride) {
      const int m0 = (t / n_tiles) * BM, n0 = (t % n_tiles) * BN;
      const int b0 = n0 / g.s_hw, oh0 = (n0 - b0 * g.s_hw) / g.s_w;
      int step = first_step;  // A's column / 64
#pragma unroll
      for (int cls = 0; cls < NC; ++cls) {  // (NC 1: the whole filter)
        const int taps_w = NC > 1 ? classes.taps_w[cls] : g.kw;
        const int pad_h = NC > 1 ? classes.pad_h[cls] : g.pad_h;
        const int pad_w = NC > 1 ? classes.pad_w[cls] : g.pad_w;
        const int end =
            NC > 1 ? step + classes.taps_h[cls] * taps_w * channels / CK : first_step + steps;
        // (NC 1) the split's first tap; (NC 4) the class's first, whose taps may be none
        const int tap = NC > 1 ? 0 : first_step * CK / channels;
        int c = NC > 1 ? 0 : first_step * CK - tap * channels, kh = NC > 1 ? 0 : tap / taps_w,
            kw = tap - kh * taps_w;
        for (; step < end; ++step, ++gstep) {
          const int buf = gstep % STAGES;
          if (gstep >= STAGES) mbarrier_wait(empty + buf, (gstep / STAGES - 1) & 1);
          mbarrier_expect_bytes(full + buf, STAGE_BYTES);
          tma_load_2d(s + buf * A_STAGE, filters, full + buf, step * CK, m0);
          tma_load_4d(s + STAGES * A_STAGE + buf * B_STAGE, image, full + buf, c, kw - pad_w,
                      oh0 * g.stride + kh - pad_h, b0);
          if ((c += CK) == channels) {  // the next tap
            c = 0;
            if (++kw == taps_w) {
              kw = 0;
              ++kh;
            }
          }
        }
      }
    }
    return;
  }
  const int team = threadIdx.x / TEAM, group = (threadIdx.x % TEAM) / 128;
  const int warp = (threadIdx.x / 32) % 4;
  int done = 0;  // this team's tiles so far
  for (int j = team, t = first_tile + team * tile_stride; t < tiles;
       j += TEAMS, t += TEAMS * tile_stride, ++done) {
    const int m0 = (t / n_tiles) * BM, n0 = (t % n_tiles) * BN;
    if (TEAMS > 1 && (team == 1 || done > 0))  // the other team's previous K loop has passed
      mbarrier_wait(turn + team, (team == 0 ? done - 1 : done) & 1);
    int g0 = j * steps;                  // the block's step of this class's first
    unsigned held[NC > 1 ? BN / 4 : 1];  // (NC 4) class (rh, 0)'s sums, rounded, for (rh, 1)'s
#pragma unroll
    for (int cls = 0; cls < NC; ++cls) {
      const int class_steps =
          NC > 1 ? classes.taps_h[cls] * classes.taps_w[cls] * channels / CK : steps;
      float acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
      for (int step = 0; step < class_steps; ++step) {
        const int buf = (g0 + step) % STAGES;
        mbarrier_wait(full + buf, ((g0 + step) / STAGES) & 1);
        wgmma_k64<T, BN>(acc, s + buf * A_STAGE + group * 64 * 64,
                         s + STAGES * A_STAGE + buf * B_STAGE);
        wgmma_wait<1>();  // step - 1's multiplies are done: its stage may be loaded again
        wgmma_hold(acc);
        if (step > 0) mbarrier_arrive(empty + (g0 + step - 1) % STAGES);
      }
      if (TEAMS > 1 && cls == NC - 1) mbarrier_arrive(turn + (1 - team));
      wgmma_wait<0>();
      wgmma_hold(acc);
      if (class_steps > 0) mbarrier_arrive(empty + (g0 + class_steps - 1) % STAGES);
      g0 += class_steps;
      if constexpr (NC > 1) {
        if (cls % 2 == 0) {
#pragma unroll
          for (int i = 0; i < BN / 4; ++i) held[i] = rounded_pair<T>(acc[2 * i], acc[2 * i + 1]);
        } else {
          if (nhwc)
            store_class_pair<T, BN, true>(y, g, classes, cls / 2, m0 + group * 64 + warp * 16, n0,
                                          held, acc);
          else
            store_class_pair<T, BN, false>(y, g, classes, cls / 2, m0 + group * 64 + warp * 16, n0,
                                           held, acc);
        }
        continue;
      }
      if (SPLIT > 1) {  // (one tile a block) the halves' sums meet in the first block's stages
        float* sums = reinterpret_cast<float*>(s);  // [BN / 8][CONSUMERS] float4s
        cluster_sync();  // the first block's multiplies have read its stages
        if (rank == 1) {
          const unsigned first = cluster_address(sums, 0);
#pragma unroll
          for (int i = 0; i < BN / 8; ++i)
            cluster_store4(first + (i * CONSUMERS + threadIdx.x) * 16u, acc[4 * i], acc[4 * i + 1],
                           acc[4 * i + 2], acc[4 * i + 3]);
        }
        cluster_sync();  // the second half's sums have landed
        if (rank == 1) continue;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i) {
          const float4 v = reinterpret_cast<const float4*>(sums)[i * CONSUMERS + threadIdx.x];
          acc[4 * i] += v.x;
          acc[4 * i + 1] += v.y;
          acc[4 * i + 2] += v.z;
          acc[4 * i + 3] += v.w;
        }
      }
      const int row0 = m0 + group * 64 + warp * 16;
      bool stored = false;
      if constexpr (sizeof(T) == 2) {  // (16-bit only: the channels-last and staged stores)
        if (nhwc)
          nhwc_store_c<T, BN>(y, g, row0, n0, acc, stage, nhwc_vectors);
        else if (staged)
          staged_store_c<T, BN>(y, g, row0, n0, acc, stage);
        stored = nhwc || staged;
      }
      if (!stored)
        mma_store_c<T, 1, BN / 8>(y, g, row0, n0,
                                  *reinterpret_cast<const float(*)[1][BN / 8][4]>(&acc));
      if constexpr (MOMENTS) store_run_moments<T, BN>(moments, g, row0, n0, acc);
    }
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA_TMA
extern "C" __global__ void __launch_bounds__(128 * (KILN_BM / 64) * KILN_TEAMS + 32)
    KILN_CONV_WGMMA_TMA(const __grid_constant__ kiln::cuda::TmaDescriptor filters,
                        const __grid_constant__ kiln::cuda::TmaDescriptor image,
                        KILN_T* __restrict__ y, float* __restrict__ moments,
                        kiln::cuda::ConvGemmShape g, kiln::cuda::ConvClasses classes, int staging) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_wgmma_tma<KILN_T, KILN_BM, KILN_BN, KILN_STAGES, KILN_TEAMS, KILN_SPLIT,
                             KILN_MOMENTS != 0, KILN_CLASSES>(&filters, &image, y, moments, g,
                                                              classes, staging);
}
#endif
