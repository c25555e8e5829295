// The channels-last forward and input gradient of bf16/f16 convolutions, and of f32 ones under
// TF32, on sm_90's warpgroup tensor-core instructions (wgmma; issue 17): the same implicit GEMM
// as conv_mma_nhwc.cuh, y[co, (b, pix)] = W'[co, (kh, kw, c)] x patches[(kh, kw, c), (b, pix)],
// K tap-major, with the same cp.async loads (a 16-byte piece is 8 channels of one pixel, 4 in
// f32), but multiplied by wgmma.mma_async: each warpgroup (4 warps) owns 64 filters by BN pixels
// of the block's tile and multiplies them straight from shared memory, 64 x BN x 16 (TF32: x 8)
// an instruction, while the next stages load. Both operands are K-major, as TF32 requires.
// Compiled for sm_90a (the instructions exist on sm_90 only).
//
// Shared memory: STAGES buffers of A (BM filter rows) and B (BN pixel rows), each row one K
// step of 128 bytes (64 16-bit elements, 32 f32), in wgmma.cuh's 128-byte swizzle.
//
// The pipeline, per K step s: wait for stage s's copies, make them visible to the tensor cores
// (fence.proxy.async) and to every thread (barrier), start the copies of stage s + STAGES - 2
// into the buffer that step s - 2 read (each warpgroup has waited for its step s - 2 before the
// barrier), issue step s's four multiplies and wait only for step s - 1's: one step of
// multiplies stays in flight behind the loads.
// conv_mma.cuh's mma_store_c writes the accumulators.
#pragma once

#include "backends/cuda/kernels/conv_mma_nhwc.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

template <typename T, int BM, int BN, int STAGES, typename Loads>
__device__ __forceinline__ void conv_wgmma_with(const T* __restrict__ w, const T* __restrict__ xt,
                                                T* __restrict__ y, const ConvGemmShape& g) {
  constexpr int STEP = Loads::STEP;
  constexpr int A_STAGE = BM * 64, B_STAGE = BN * 64;  // 16-bit units
  static_assert(BM % 64 == 0 && STAGES >= 3, "tile and stages");
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  unsigned short* s = wgmma_tiles(wgmma_smem);
  const int group = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  Loads loads(xt, g, n0, 0);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  const int steps = (g.k + STEP - 1) / STEP;
  auto a_tile = [&](int buf) { return s + buf * A_STAGE; };
  auto b_tile = [&](int buf) { return s + STAGES * A_STAGE + buf * B_STAGE; };
  auto load_stage = [&](int step) {  // in order: each call advances the loads' piece
    const int buf = step % STAGES;
    loads.stage(
        w, g, m0, step * STEP, g.k,
        [&](int row, int pc) { return swizzled_piece(a_tile(buf), row, pc); },
        [&](int row, int pc) { return swizzled_piece(b_tile(buf), row, pc); });
  };
#pragma unroll
  for (int st = 0; st < STAGES - 2; ++st) {
    if (st < steps) load_stage(st);
    cp_async_commit();
  }
  for (int step = 0; step < steps; ++step) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 3) : "memory");  // stage `step` here
    fence_shared_to_async();
    __syncthreads();  // everyone's copies landed; every group's step - 2 multiplies done
    if (step + STAGES - 2 < steps) load_stage(step + STAGES - 2);
    cp_async_commit();
    wgmma_k64<T, BN>(acc, a_tile(step % STAGES) + group * 64 * 64, b_tile(step % STAGES));
    wgmma_wait<1>();
    wgmma_hold(acc);
  }
  wgmma_wait<0>();
  wgmma_hold(acc);
  mma_store_c<T, 1, BN / 8>(y, g, m0 + group * 64 + warp * 16, n0,
                            *reinterpret_cast<const float(*)[1][BN / 8][4]>(&acc));
}

// The kernel: the tap-aligned loads where they apply (nhwc_taps_aligned), else the general ones.
template <typename T, int BM, int BN, int STAGES, int DIL>
__device__ __forceinline__ void conv_wgmma(const T* __restrict__ w, const T* __restrict__ xt,
                                           T* __restrict__ y, const ConvGemmShape& g) {
  constexpr int NT = 128 * (BM / 64);
  if constexpr (DIL == 1)
    if (nhwc_taps_aligned(g, 8 * Bits<T>::piece))
      return conv_wgmma_with<T, BM, BN, STAGES, NhwcTapLoads<T, NT, 8, BM, BN>>(w, xt, y, g);
  conv_wgmma_with<T, BM, BN, STAGES, NhwcStageLoads<T, NT, 8, BM, BN, DIL>>(w, xt, y, g);
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA
extern "C" __global__ void __launch_bounds__(128 * (KILN_BM / 64))
    KILN_CONV_WGMMA(const KILN_T* __restrict__ w, const KILN_T* __restrict__ xt,
                    KILN_T* __restrict__ y, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_wgmma<KILN_T, KILN_BM, KILN_BN, KILN_STAGES, KILN_DIL>(w, xt, y, g);
}
#endif
