// The channels-last forward (stride 1 or 2) and stride-1 input gradient of bf16/f16
// convolutions with both operands brought by the tensor memory accelerator (TMA, sm_90; issue
// 17): where the image's channels are a multiple of 64, the convolution is undilated and a tile
// of BN output pixels is whole output rows (of one image, or whole images), each K step's B tile
// (BN pixels x 64 channels of one tap) is one 4-D box of the NHWC image, [n][h][w][c], shifted
// by the tap: rows stride oh + kh - pad_h, columns stride ow + kw - pad_w (every stride-th row
// and column: the map's element strides; the TMA fills what lies outside the image with zeros,
// the padding). A's 64-element K slice of BM filter rows is one 2-D box.
// Both land in wgmma's 128-byte swizzle, which is the TMA's 128-byte swizzle.
//
// One producer warp (the last) issues a step's two copies on the stage's `full` barrier (which
// completes when their bytes have arrived); WM warpgroups (BM = 64 WM) multiply, 64 filters by
// BN pixels each, and arrive on the stage's `empty` barrier when their multiplies are done. The
// consumers' K loop is a wait, four wgmma and an arrive: no address arithmetic at all.
// The sums are those of conv_wgmma.cuh (the same K steps in the same order): the same bits.
#pragma once

#include "backends/cuda/kernels/conv_mma.cuh"
#include "backends/cuda/kernels/tma.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

// y = W' x patches (conv_wgmma.cuh's GEMM) over `image` (the NHWC image's box map: channels,
// columns, rows, images; boxes of 64 x s_w x rows x images = BN pixels) and `filters` (A's map:
// K, M; boxes of 64 x BM).
template <typename T, int BM, int BN, int STAGES>
__device__ __forceinline__ void conv_wgmma_tma(const TmaDescriptor* filters,
                                               const TmaDescriptor* image, T* __restrict__ y,
                                               const ConvGemmShape& g) {
  constexpr int WM = BM / 64, CONSUMERS = 128 * WM;
  constexpr int A_STAGE = BM * 64, B_STAGE = BN * 64;  // 16-bit units
  constexpr unsigned STAGE_BYTES = (A_STAGE + B_STAGE) * 2;
  static_assert(BM % 64 == 0 && STAGES >= 2, "tile and stages");
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  unsigned short* s = wgmma_tiles(wgmma_smem);
  auto* full = reinterpret_cast<unsigned long long*>(s + STAGES * (A_STAGE + B_STAGE));
  unsigned long long* empty = full + STAGES;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int channels = g.k / g.khkw, steps = g.k / 64;
  if (threadIdx.x == 0)
    for (int i = 0; i < STAGES; ++i) {
      mbarrier_init(full + i, 1);
      mbarrier_init(empty + i, CONSUMERS);
    }
  if (threadIdx.x == 0) mbarrier_init_fence();
  __syncthreads();
  if (threadIdx.x >= CONSUMERS) {  // the producer warp: one thread issues the copies
    if (threadIdx.x != CONSUMERS) return;
    const int b0 = n0 / g.s_hw, oh0 = (n0 - b0 * g.s_hw) / g.s_w;
    int c = 0, kh = 0, kw = 0;
    for (int step = 0; step < steps; ++step) {
      const int buf = step % STAGES;
      if (step >= STAGES) mbarrier_wait(empty + buf, (step / STAGES - 1) & 1);
      mbarrier_expect_bytes(full + buf, STAGE_BYTES);
      tma_load_2d(s + buf * A_STAGE, filters, full + buf, step * 64, m0);
      tma_load_4d(s + STAGES * A_STAGE + buf * B_STAGE, image, full + buf, c, kw - g.pad_w,
                  oh0 * g.stride + kh - g.pad_h, b0);
      if ((c += 64) == channels) {  // the next tap
        c = 0;
        if (++kw == g.kw) {
          kw = 0;
          ++kh;
        }
      }
    }
    return;
  }
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4;
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  for (int step = 0; step < steps; ++step) {
    const int buf = step % STAGES;
    mbarrier_wait(full + buf, (step / STAGES) & 1);
    wgmma_k64<T, BN>(acc, s + buf * A_STAGE + group * 64 * 64,
                     s + STAGES * A_STAGE + buf * B_STAGE);
    wgmma_wait<1>();  // step - 1's multiplies are done: its stage may be loaded again
    wgmma_hold(acc);
    if (step > 0) mbarrier_arrive(empty + (step - 1) % STAGES);
  }
  wgmma_wait<0>();
  wgmma_hold(acc);
  mma_store_c<T, 1, BN / 8>(y, g, m0 + group * 64 + warp * 16, n0,
                            *reinterpret_cast<const float(*)[1][BN / 8][4]>(&acc));
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA_TMA
extern "C" __global__ void __launch_bounds__(128 * (KILN_BM / 64) + 32)
    KILN_CONV_WGMMA_TMA(const __grid_constant__ kiln::cuda::TmaDescriptor filters,
                        const __grid_constant__ kiln::cuda::TmaDescriptor image,
                        KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g) {
  kiln::cuda::conv_wgmma_tma<KILN_T, KILN_BM, KILN_BN, KILN_STAGES>(&filters, &image, y, g);
}
#endif
