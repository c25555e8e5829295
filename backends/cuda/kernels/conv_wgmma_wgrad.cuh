// The weight gradient of bf16/f16 convolutions, and of f32 ones under TF32, on sm_90's wgmma
// (issue 17): conv_mma_wgrad.cuh's implicit GEMM dW[co, (c, kh, kw)] = dy[co, (b, pix)] x
// patches[(b, pix), (c, kh, kw)], with its loads (dy by cp.async or scalars, the patches
// gathered into registers as scalars or 16-byte runs) writing 128-byte rows (a step: 64 16-bit
// pixels, or 32 f32 ones, both operands K-major as TF32 requires) in wgmma.cuh's 128-byte
// swizzle, and each warpgroup multiplying its 64 filters by the block's BN patch rows straight
// from shared memory. K (the batch's pixels) is split over blockIdx.z as conv_mma_wgrad.cuh
// splits it, so every tile sums each element over the same steps in the same order.
//
// Three buffers, per step s: store the registers gathered for s (the buffer was read by step
// s - 3, which every warpgroup waited for before the last barrier), wait for s's dy copies,
// fence them to the tensor cores, barrier; start dy's copies and the gathers of step s + 1;
// issue s's multiplies and wait for s - 1's. The gathers' latency hides behind the multiplies.
#pragma once

#include "backends/cuda/kernels/conv_mma_wgrad.cuh"
#include "backends/cuda/kernels/wgmma.cuh"

namespace kiln::cuda {

// wgmma.cuh's swizzled 128-byte rows, by element.
struct SwizzledRows {
  template <typename E>
  __device__ static E* at(E* tile, int r, int c) {
    constexpr int EP = Bits<E>::piece, SHIFT = EP == 8 ? 3 : 2;  // (c >= 0)
    return swizzled_piece(tile, r, c >> SHIFT) + (c & (EP - 1));
  }
};

template <typename T, typename OT, int BM, int BN, bool VEC_A, bool VEC_B>
__device__ __forceinline__ void conv_wgmma_grad_weight(const T* __restrict__ dy,
                                                       const T* __restrict__ x,
                                                       OT* __restrict__ out,
                                                       const ConvGemmShape& g) {
  using E = typename Bits<T>::type;
  constexpr int BK = 8 * Bits<E>::piece, GROUPS = BM / 64, NT = 128 * GROUPS, G = 8, BUFFERS = 3;
  constexpr int A_TILE = BM * BK, B_TILE = BN * BK;  // elements (E)
  constexpr int R = VEC_B ? 1 : BN * BK / NT, P = BN * G / NT;
  constexpr int AS = VEC_A ? 1 : BM * BK / NT;
  static_assert(BM % 64 == 0 && P * NT == BN * G && (BM * G) % NT == 0 && NT % BK == 0,
                "wgmma wgrad tile");
  extern __shared__ __align__(16) unsigned char wgmma_wgrad_smem[];
  E* s = reinterpret_cast<E*>(wgmma_tiles(wgmma_wgrad_smem));
  int4* ntab = reinterpret_cast<int4*>(s + BUFFERS * (A_TILE + B_TILE));
  auto a_tile = [&](int buf) { return s + buf * A_TILE; };
  auto b_tile = [&](int buf) { return s + BUFFERS * A_TILE + buf * B_TILE; };
  const E* dyb = reinterpret_cast<const E*>(dy);
  const E* xb = reinterpret_cast<const E*>(x);
  const int t = threadIdx.x, group = t / 128, warp = (t / 32) % 4;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * g.k_chunk;
  const int k_end = min(g.k, k_begin + g.k_chunk);
  out += (long long)blockIdx.z * g.m * g.n;
  const int kk = t % BK, nb = (t / BK) * R;  // this thread's pixel, patch rows (scalar gathers)
  wgrad_patch_table<NT, BN>(ntab, g, n0);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  __syncthreads();
  E ra[AS], rb[R];
  WgradRuns<P> runs;
  auto gather = [&](int k0) {
    if (VEC_B)
      wgrad_gather_runs<NT, G, P>(xb, g, k0, k_end, ntab, runs);
    else
      wgrad_gather<R>(xb, g, wgrad_pixel(g, k0 + kk, k_end), ntab + nb, rb);
  };
  const int steps = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
  if (steps > 0) {
    wgrad_load_a<NT, BM, BK, AS, VEC_A, SwizzledRows>(dyb, g, m0, k_begin, k_end, a_tile(0), ra);
    gather(k_begin);
  }
  for (int step = 0; step < steps; ++step) {
    const int buf = step % BUFFERS;
    wgrad_store_staged<NT, BK, VEC_A, VEC_B, AS, R, SwizzledRows>(a_tile(buf), b_tile(buf), ra, rb,
                                                                  nb, kk);
    if (VEC_B) wgrad_store_runs<NT, G, P, SwizzledRows>(b_tile(buf), runs);
    if (VEC_A) cp_async_wait_all();
    fence_shared_to_async();
    __syncthreads();  // this step's tiles are complete; step - 2's multiplies are done
    if (step + 1 < steps) {
      const int k0 = k_begin + (step + 1) * BK;
      wgrad_load_a<NT, BM, BK, AS, VEC_A, SwizzledRows>(dyb, g, m0, k0, k_end,
                                                        a_tile((step + 1) % BUFFERS), ra);
      gather(k0);
    }
    wgmma_k64<T, BN>(acc, a_tile(buf) + group * 64 * BK, b_tile(buf));
    wgmma_wait<1>();
    wgmma_hold(acc);
  }
  wgmma_wait<0>();
  wgmma_hold(acc);
  wgrad_store_c<OT, 16, BN>(out, g, m0 + group * 64 + warp * 16, n0,
                            *reinterpret_cast<const float(*)[1][BN / 8][4]>(&acc));
}

}  // namespace kiln::cuda

#ifdef KILN_CONV_WGMMA_WGRAD
extern "C" __global__ void __launch_bounds__(128 * (KILN_BM / 64))
    KILN_CONV_WGMMA_WGRAD(const KILN_T* __restrict__ dy, const KILN_T* __restrict__ x,
                          KILN_OT* __restrict__ out, kiln::cuda::ConvGemmShape g) {
  KILN_AFTER_PRIOR_GRIDS();
  kiln::cuda::conv_wgmma_grad_weight<KILN_T, KILN_OT, KILN_BM, KILN_BN, KILN_VEC_A, KILN_VEC_B>(
      dy, x, out, g);
}
#endif
