// The parameter blocks of the pooling kernels (max_pool.cuh, max_pool32.cuh, avg_pool.cuh),
// passed by value: the one definition that the host code and NVRTC both compile.
#pragma once

namespace kiln::cuda {

// x: [planes, H, W], square windows (graph/kernels/pool_cpu.h's PoolGeometry).
struct PoolShape {
  long long planes, height, width, kernel, stride, padding, out_h, out_w;
};
static_assert(sizeof(PoolShape) == 8 * 8, "PoolShape: eight 64-bit fields");

// The same with 32-bit fields, for planes * H * W < 2^30 (the fast kernels).
struct PoolShape32 {
  int planes, height, width, kernel, stride, padding, out_h, out_w;
};
static_assert(sizeof(PoolShape32) == 8 * 4, "PoolShape32: eight 32-bit fields");

// The gradient over whole planes a block (max_pool32.cuh's max_pool32_grad_planes): planes of
// at most kPlaneCells cells and windows, kPlaneThreads threads, as many planes a block as fit
// but no more than leave kPlaneBlocks blocks (AlexNet's [64, 64, 7, 7] at 83 planes a block
// made 50 blocks for 132 SMs, slower than the gather from global memory).
constexpr int kPlaneCells = 4096, kPlaneThreads = 256, kPlaneBlocks = 512;
#ifdef __CUDACC_RTC__
#define KILN_POOL_BOTH __host__ __device__
#else
#define KILN_POOL_BOTH
#endif
KILN_POOL_BOTH inline int planes_per_block(const PoolShape32& g) {
  const int by_cells = kPlaneCells / (g.height * g.width);
  const int by_windows = kPlaneCells / (g.out_h * g.out_w);
  const int fit = by_cells < by_windows ? by_cells : by_windows;
  const int spread = g.planes / kPlaneBlocks;
  return spread < 1 ? 1 : spread < fit ? spread : fit;
}

#ifdef __CUDACC_RTC__
// dy as max_pool2d_grad relu=1 routes it (graph/kernels/pool_max_rule.h's relu_routed): dy where
// the window's maximum is positive, else dy * 0, in the kernel's wide type W.
template <typename W>
__device__ __forceinline__ W relu_routed(W dy, W max, int relu) {
  return relu && !(max > W(0)) ? dy * W(0) : dy;
}
#endif

}  // namespace kiln::cuda
