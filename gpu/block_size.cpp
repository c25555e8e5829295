// The occupancy-best block size (gpu/block_size.h), through the CUDA runtime.
#include "gpu/block_size.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::gpu {

DeviceLimits current_device_limits() {
  int device = 0;
  DeviceLimits l;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l.max_threads_per_sm,
                                         cudaDevAttrMaxThreadsPerMultiProcessor, device));
  return l;
}

BlockChoice choose_block_size(const LoadedKernel& kernel) {
  const int max_block = std::min(kernel.attributes().max_threads_per_block, 1024);
  BlockChoice best;
  int best_threads = 0;
  for (int block = 64; block <= max_block; block *= 2) {
    const int blocks = kernel.max_active_blocks_per_sm(block, 0);
    if (blocks * block > best_threads) {
      best_threads = blocks * block;
      best = {block, blocks};
    }
  }
  KILN_CHECK(best_threads > 0, "kernel {} cannot run at any block size (max {} threads per block)",
             kernel.name(), max_block);
  return best;
}

}  // namespace kiln::gpu
