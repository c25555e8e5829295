// Hand-written kernels, compiled through the kernel cache (NVRTC, disk cache) for the
// current device, loaded once per (name, device), with a block size chosen by occupancy.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_runtime.h"

namespace kiln::cuda {

// A loaded kernel and its launch shape for grid-stride loops over independent work items.
struct DeviceKernel {
  gpu::LoadedKernel kernel;
  unsigned block = 0;            // threads per block with the most resident threads per SM
  std::int64_t max_blocks = 0;   // blocks resident on the whole device at that block size
  std::size_t shared_limit = 0;  // dynamic shared memory the kernel may take (0: the default)
};

// The kernel `name` for the current device; `make_source` is called only on the first
// request (per device) and must return a source whose kernel is `name`. Thread-safe;
// the returned reference lives until the process exits.
const DeviceKernel& device_kernel(const std::string& name,
                                  const std::function<gpu::KernelSource()>& make_source);

// The same, for a kernel launched with `dynamic_shared_bytes` of dynamic shared memory: its
// limit is raised to that on first use (which launches above 48 KiB need).
const DeviceKernel& device_kernel(const std::string& name,
                                  const std::function<gpu::KernelSource()>& make_source,
                                  std::size_t dynamic_shared_bytes);

// Compiles (in parallel) and loads all of `sources` for the current device, so that the
// first launches of a training step do not wait for NVRTC.
void preload_kernels(const std::vector<gpu::KernelSource>& sources);

// Launches `k` with enough blocks to cover `work_items` items of one thread each (at most
// the device's resident blocks: kernels loop over the rest). Does nothing for 0 items.
void launch_items(const DeviceKernel& k, std::int64_t work_items, gpu::Stream stream, void** args);

}  // namespace kiln::cuda
