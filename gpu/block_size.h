// The one block-size rule for kiln's kernels, generated and hand-written alike: the
// occupancy-best power of two, and the device limits that turn it into a grid.
#pragma once

#include "gpu/cuda_runtime.h"

namespace kiln::gpu {

// The current device's size, as occupancy needs it.
struct DeviceLimits {
  int sms = 0;
  int max_threads_per_sm = 0;
};
DeviceLimits current_device_limits();

struct BlockChoice {
  int block = 0;          // threads per block
  int blocks_per_sm = 0;  // resident blocks per SM at that size
};

// The block size (a power of two from 64 up to min(1024, the kernel's limit)) with the most
// resident threads per SM; the smaller wins a tie (more blocks to spread a grid over). A
// multiple of 32, as reductions need. Throws kiln::Error naming `kernel` if none fits.
BlockChoice choose_block_size(const LoadedKernel& kernel);

}  // namespace kiln::gpu
