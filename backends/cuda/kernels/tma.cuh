// The tensor memory accelerator's copies (sm_90): a box of a tensor described by a tensor map
// (encoded on the host, conv_tma.cpp) into shared memory, completing on an mbarrier that
// expects the bytes (mbarrier_expect_bytes). Coordinates outside the tensor read as zeros.
#pragma once

#include "backends/cuda/kernels/mbarrier.cuh"

namespace kiln::cuda {

// A CUtensorMap's 128 bytes, passed by value as a __grid_constant__ kernel parameter.
struct alignas(64) TmaDescriptor {
  unsigned long long opaque[16];
};

__device__ __forceinline__ void mbarrier_expect_bytes(unsigned long long* bar, unsigned bytes) {
  asm volatile(
      "{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}" ::"r"(
          shared_address(bar)),
      "r"(bytes)
      : "memory");
}
// The box of `map` at coordinates (c0, c1, ..: innermost first) into `dst`, completing on `bar`
// (whose transaction count the box's bytes lower, zeros outside the tensor included).
__device__ __forceinline__ void tma_load_2d(void* dst, const TmaDescriptor* map,
                                            unsigned long long* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3}], [%4];" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(shared_address(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void* dst, const TmaDescriptor* map,
                                            unsigned long long* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4}], [%5];" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDescriptor* map,
                                            unsigned long long* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5}], [%6];" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(void* dst, const TmaDescriptor* map,
                                            unsigned long long* bar, int c0, int c1, int c2, int c3,
                                            int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], "
      "[%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(shared_address(bar))
      : "memory");
}

}  // namespace kiln::cuda
