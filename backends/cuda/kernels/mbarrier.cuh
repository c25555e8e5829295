// Shared-memory barriers of sm_90 (mbarrier) for kernels whose warps play different parts: a
// barrier counts arrivals and completes a phase when the count it was made with has arrived;
// a waiter names the phase it waits for by its parity (0 for the first, 1 for the second, ...).
#pragma once

#include "backends/cuda/kernels/mma.cuh"

namespace kiln::cuda {

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}" ::"r"(
                   shared_address(bar))
               : "memory");
}
// Makes the barriers this thread initialised visible to the async proxy (the TMA's
// completions); a __syncthreads after it shows them to the other threads.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// Returns once the phase of parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, "
        "0, p;\n}"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}

}  // namespace kiln::cuda
