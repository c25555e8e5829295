// The TMA channels-last pass of a 64-channel, at most 64-filter, stride-1 convolution in its
// halo form (sm_90, bf16/f16; issue 17): resnet18's stage-1 layers, forward and input gradient.
//
// The plain TMA pass (conv_wgmma_tma.cuh) brings, for each of a tile's K steps, the step's 64
// filter columns and one box of BN pixels shifted by the step's tap: a 3x3 layer of 64 channels
// reads its tile's pixels nine times and the whole filter once per tile. Its stage-1 passes are
// bound by those copies from L2 (about 0.9 GB a pass at batch 512), not by the multiplies. Here
//  - the filter (KH x KW taps of 64 filters x 64 channels: 72 KiB for 3x3) is copied into
//    shared memory once per block and stays there (`a_taps`, tap-major: A's K order);
//  - a tile of BN pixels, R whole output rows of one image, takes one box a column of taps kw:
//    R + KH - 1 rows from oh0 - pad_h, its columns shifted by kw - pad_w (zeros outside the
//    image, the padding). Tap (kh, kw)'s B tile is that box from row kh on: BN rows of 128 bytes
//    kh * s_w rows in, a multiple of 8 rows (s_w % 8 == 0) so that the 128-byte swizzle's phase
//    is the box's own;
// so a tile copies (R + KH - 1) / (R KH) of the pixels the plain pass copies, and no filter.
//
// The K steps are the plain pass's, in its order (tap-major, one 64-channel step a tap), so the
// sums are the same bits. A persistent block an SM: two teams of one warpgroup take its tiles in
// turn, each with its own KW boxes (one stage a team); their K loops run one after the other
// (the `turn` barriers) so that one team's epilogue overlaps the other's multiplies, and the
// producer warp refills a team's boxes once the team's multiplies are done (`empty`).
#pragma once

#include "backends/cuda/kernels/conv_mma.cuh"
#include "backends/cuda/kernels/tma.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

// y = W' x patches (64 filters, M <= 64) over `image` (the NHWC image's map: channels, columns,
// rows, images; boxes of 64 x s_w x (BN / s_w + KH - 1) x 1) and `filters` (A: K, M; boxes of
// 64 x 64), BN pixels a tile, the tiles dealt out to the blocks in turn.
template <typename T, int BN>
__device__ __forceinline__ void conv_wgmma_tma_halo(const TmaDescriptor* filters,
                                                    const TmaDescriptor* image, T* __restrict__ y,
                                                    const ConvGemmShape& g, int staging) {
  constexpr int A_TAP = 64 * 64;  // a tap's 64 filters x 64 channels, 16-bit units
  const int taps_w = g.kw, taps_h = g.khkw / g.kw, taps = g.khkw;
  const int box = (BN / g.s_w + taps_h - 1) * g.s_w * 64;  // a box, 16-bit units
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  __shared__ unsigned long long bars[5 + 2 * kHaloMaxTapsW];
  unsigned short* a_taps = wgmma_tiles(wgmma_smem);
  unsigned short* boxes = a_taps + taps * A_TAP;  // [team][kw]
  unsigned long long* a_full = bars;              // the filter has landed
  unsigned long long* empty = bars + 1;           // [team]: its multiplies are done
  unsigned long long* turn = bars + 3;            // [team]: the other team's K loop is done
  unsigned long long* full = bars + 5;            // [team][kw]: the box has landed
  // Each consumer warp's staging tile (staged_store_c), after the boxes; rows of s_w % 8 == 0
  // pixels (conv_tma_halo_tile).
  unsigned short* stage = boxes + 2 * taps_w * box + (threadIdx.x / 32) * (kStageWarpBytes / 2);
  const bool aligned = (reinterpret_cast<unsigned long long>(y) & 15ull) == 0ull;
  const bool staged = staging == 1 && aligned;  // (staging 2: y channels-last, nhwc_store_c)
  const bool nhwc = staging == 2, nhwc_vectors = g.m % 8 == 0 && aligned;
  const int tiles = (g.n + BN - 1) / BN;
  if (threadIdx.x == 0) {
    mbarrier_init(a_full, 1);
    for (int i = 0; i < 2; ++i) {
      mbarrier_init(empty + i, 128);
      mbarrier_init(turn + i, 128);
    }
    for (int i = 0; i < 2 * taps_w; ++i) mbarrier_init(full + i, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= 256) {  // the producer warp: one thread issues the copies
    if (threadIdx.x != 256) return;
    mbarrier_expect_bytes(a_full, static_cast<unsigned>(taps * A_TAP * 2));
    for (int i = 0; i < taps; ++i) tma_load_2d(a_taps + i * A_TAP, filters, a_full, i * 64, 0);
    int j = 0;  // the block's tiles so far: team j % 2's (j / 2)-th
    for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++j) {
      const int team = j % 2, use = j / 2;
      if (use > 0) mbarrier_wait(empty + team, (use - 1) & 1);
      const int n0 = t * BN, b0 = n0 / g.s_hw, oh0 = (n0 - b0 * g.s_hw) / g.s_w;
      for (int kw = 0; kw < taps_w; ++kw) {
        unsigned long long* bar = full + team * taps_w + kw;
        mbarrier_expect_bytes(bar, static_cast<unsigned>(box * 2));
        tma_load_4d(boxes + (team * taps_w + kw) * box, image, bar, 0, kw - g.pad_w, oh0 - g.pad_h,
                    b0);
      }
    }
    return;
  }
  const int team = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4;
  const unsigned short* mine = boxes + team * taps_w * box;
  mbarrier_wait(a_full, 0);
  int done = 0;  // this team's tiles so far
  for (int t = blockIdx.x + team * gridDim.x; t < tiles; t += 2 * gridDim.x, ++done) {
    if (team == 1 || done > 0)  // the other team's previous K loop has passed
      mbarrier_wait(turn + team, (team == 0 ? done - 1 : done) & 1);
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
    for (int kh = 0; kh < taps_h; ++kh)
      for (int kw = 0; kw < taps_w; ++kw) {
        if (kh == 0) mbarrier_wait(full + team * taps_w + kw, done & 1);
        wgmma_k64<T, BN>(acc, a_taps + (kh * taps_w + kw) * A_TAP,
                         mine + kw * box + kh * g.s_w * 64);
        wgmma_wait<1>();
        wgmma_hold(acc);
      }
    mbarrier_arrive(turn + (1 - team));
    wgmma_wait<0>();
    wgmma_hold(acc);
    mbarrier_arrive(empty + team);  // the boxes may be refilled
    if (nhwc)
      nhwc_store_c<T, BN>(y, g, warp * 16, t * BN, acc, stage, nhwc_vectors);
    else if (staged)
      staged_store_c<T, BN>(y, g, warp * 16, t * BN, acc, stage);
    else
      mma_store_c<T, 1, BN / 8>(y, g, warp * 16, t * BN,
                                *reinterpret_cast<const float(*)[1][BN / 8][4]>(&acc));
  }
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA_TMA_HALO
extern "C" __global__ void __launch_bounds__(288)
    KILN_CONV_WGMMA_TMA_HALO(const __grid_constant__ kiln::cuda::TmaDescriptor filters,
                             const __grid_constant__ kiln::cuda::TmaDescriptor image,
                             KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g, int staging) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_wgmma_tma_halo<KILN_T, KILN_BN>(&filters, &image, y, g, staging);
}
#endif
