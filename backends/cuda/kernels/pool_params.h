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

}  // namespace kiln::cuda
