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

// Thread block clusters (sm_90): a kernel launched with a cluster dimension (gpu::LoadedKernel::
// launch_clusters) runs its blocks in groups placed together, which may read and write each other's
// shared memory (distributed shared memory).
// This block's rank in its cluster (blocks of a cluster of (n, 1, 1) are n consecutive x).
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned rank = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
// Every non-exited thread of the cluster arrives, then waits for the others: what a thread
// wrote to any block's shared memory before it is visible to every thread after it.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// The address, in the cluster's shared window, of what `p` (this block's shared memory) is at
// in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ unsigned cluster_address(const void* p, unsigned rank) {
  unsigned out = 0;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(out)
               : "r"(shared_address(p)), "r"(rank));
  return out;
}
// Four floats into another block's shared memory at a cluster_address (16-byte aligned).
__device__ __forceinline__ void cluster_store4(unsigned address, float a, float b, float c,
                                               float d) {
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(address), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
}

}  // namespace kiln::cuda
