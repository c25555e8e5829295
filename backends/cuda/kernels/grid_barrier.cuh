// The barrier of the persistent LSTM kernels (lstm_persistent.cuh, lstm_mma.cuh): the blocks
// of one row group of a cooperative grid wait for each other between time steps.
#pragma once

namespace kiln::cuda {

// A barrier over the blocks of one row group (the blocks that read each other's h rows),
// counting in bar[0] (arrivals) and bar[1] (exits), both 0 at launch: a block arrives after
// its step's writes (the block's threads synchronise, then thread 0 counts with release
// semantics, which publishes what the block wrote);
// waiting for step s means bar[0] >= s * blocks. The last block to exit sets both counters
// back to 0 for the next launch (stream order: it starts after this one ends).
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void grid_arrive(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0)
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" : : "l"(bar) : "memory");
}
__device__ __forceinline__ void grid_wait(unsigned* bar, unsigned target) {
  if (threadIdx.x == 0)
    while (load_acquire(bar) < target) {}
  __syncthreads();
}
__device__ __forceinline__ void grid_exit(unsigned* bar, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(bar + 1, 1u) == blocks - 1u) {
    bar[0] = 0u;
    bar[1] = 0u;
    __threadfence();
  }
}

}  // namespace kiln::cuda
