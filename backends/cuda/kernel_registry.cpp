// A process-wide registry of loaded kernels keyed by "name@device". Entries are never
// removed, so references handed out stay valid; compiling under the lock serialises first
// uses, which preload_kernels avoids by compiling a whole set in parallel up front.
#include "backends/cuda/kernel_registry.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "gpu/block_size.h"
#include "gpu/cuda_check.h"
#include "gpu/kernel_cache.h"

namespace kiln::cuda {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<DeviceKernel>> kernels;
};

Registry& registry() {
  static Registry r;
  return r;
}

int current_device() {
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

std::string key_of(const std::string& name, int device) {
  return name + "@" + std::to_string(device);
}

// Loads `compiled` with the occupancy-best block size (gpu/block_size.h).
std::unique_ptr<DeviceKernel> load(const gpu::CompiledKernel& compiled) {
  auto k = std::make_unique<DeviceKernel>(DeviceKernel{gpu::LoadedKernel(compiled), 0, 0});
  const gpu::BlockChoice choice = gpu::choose_block_size(k->kernel);
  k->block = static_cast<unsigned>(choice.block);
  k->max_blocks =
      static_cast<std::int64_t>(gpu::current_device_limits().sms) * choice.blocks_per_sm;
  return k;
}

// The entry of `name` on the current device, loaded on first use; under r.mutex.
DeviceKernel& entry_of(Registry& r, const std::string& name,
                       const std::function<gpu::KernelSource()>& make_source) {
  const std::string key = key_of(name, current_device());
  auto it = r.kernels.find(key);
  if (it != r.kernels.end()) return *it->second;
  const gpu::KernelSource source = make_source();
  KILN_ASSERT(source.name == name, "kernel source for '{}' defines '{}'", name, source.name);
  const gpu::CompiledKernel compiled =
      gpu::global_kernel_cache().get_or_compile(source, gpu::current_target());
  return *r.kernels.emplace(key, load(compiled)).first->second;
}

}  // namespace

const DeviceKernel& device_kernel(const std::string& name,
                                  const std::function<gpu::KernelSource()>& make_source) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return entry_of(r, name, make_source);
}

const DeviceKernel& device_kernel(const std::string& name,
                                  const std::function<gpu::KernelSource()>& make_source,
                                  std::size_t dynamic_shared_bytes) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  DeviceKernel& k = entry_of(r, name, make_source);
  if (k.shared_limit < dynamic_shared_bytes) {
    k.kernel.set_max_dynamic_shared_bytes(static_cast<int>(dynamic_shared_bytes));
    k.shared_limit = dynamic_shared_bytes;
  }
  return k;
}

void preload_kernels(const std::vector<gpu::KernelSource>& sources) {
  const int device = current_device();
  Registry& r = registry();
  std::vector<gpu::KernelSource> missing;
  {
    std::lock_guard lock(r.mutex);
    for (const gpu::KernelSource& s : sources)
      if (!r.kernels.contains(key_of(s.name, device))) missing.push_back(s);
  }
  if (missing.empty()) return;
  // Compiled outside the lock (in parallel, by the cache); loaded under it.
  const auto compiled = gpu::global_kernel_cache().get_or_compile(missing, gpu::current_target());
  std::lock_guard lock(r.mutex);
  for (const gpu::CompiledKernel& c : compiled) {
    const std::string key = key_of(c.name, device);
    if (!r.kernels.contains(key)) r.kernels.emplace(key, load(c));
  }
}

void launch_items(const DeviceKernel& k, std::int64_t work_items, gpu::Stream stream, void** args) {
  if (work_items <= 0) return;
  const std::int64_t wanted = (work_items + k.block - 1) / k.block;
  const auto grid = static_cast<unsigned>(std::min(wanted, k.max_blocks));
  k.kernel.launch({grid, 1, 1}, {k.block, 1, 1}, 0, stream, args);
}

}  // namespace kiln::cuda
