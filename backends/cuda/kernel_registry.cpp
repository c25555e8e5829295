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
#include "fusion/jit/cuda_check.h"
#include "fusion/jit/kernel_cache.h"

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

// The block size (a power of two from 64 up) with the most resident threads per SM; the
// smaller wins a tie (more blocks to spread a grid over).
std::unique_ptr<DeviceKernel> load(const jit::CompiledKernel& compiled, int device) {
  auto k = std::make_unique<DeviceKernel>(DeviceKernel{jit::LoadedKernel(compiled), 0, 0});
  int sms = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int max_block = std::min(k->kernel.attributes().max_threads_per_block, 1024);
  int best_threads = 0, best_blocks = 0;
  for (int block = 64; block <= max_block; block *= 2) {
    const int blocks = k->kernel.max_active_blocks_per_sm(block, 0);
    if (blocks * block > best_threads) {
      best_threads = blocks * block;
      best_blocks = blocks;
      k->block = static_cast<unsigned>(block);
    }
  }
  KILN_CHECK(best_threads > 0, "kernel {} cannot run at any block size (max {} threads per block)",
             compiled.name, max_block);
  k->max_blocks = static_cast<std::int64_t>(sms) * best_blocks;
  return k;
}

}  // namespace

const DeviceKernel& device_kernel(const std::string& name,
                                  const std::function<jit::KernelSource()>& make_source) {
  const int device = current_device();
  const std::string key = key_of(name, device);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.kernels.find(key);
  if (it != r.kernels.end()) return *it->second;
  const jit::KernelSource source = make_source();
  KILN_ASSERT(source.name == name, "kernel source for '{}' defines '{}'", name, source.name);
  const jit::CompiledKernel compiled =
      jit::global_kernel_cache().get_or_compile(source, jit::current_target());
  return *r.kernels.emplace(key, load(compiled, device)).first->second;
}

void preload_kernels(const std::vector<jit::KernelSource>& sources) {
  const int device = current_device();
  Registry& r = registry();
  std::vector<jit::KernelSource> missing;
  {
    std::lock_guard lock(r.mutex);
    for (const jit::KernelSource& s : sources)
      if (!r.kernels.contains(key_of(s.name, device))) missing.push_back(s);
  }
  if (missing.empty()) return;
  // Compiled outside the lock (in parallel, by the cache); loaded under it.
  const auto compiled = jit::global_kernel_cache().get_or_compile(missing, jit::current_target());
  std::lock_guard lock(r.mutex);
  for (const jit::CompiledKernel& c : compiled) {
    const std::string key = key_of(c.name, device);
    if (!r.kernels.contains(key)) r.kernels.emplace(key, load(c, device));
  }
}

void launch_items(const DeviceKernel& k, std::int64_t work_items, jit::Stream stream, void** args) {
  if (work_items <= 0) return;
  const std::int64_t wanted = (work_items + k.block - 1) / k.block;
  const auto grid = static_cast<unsigned>(std::min(wanted, k.max_blocks));
  k.kernel.launch({grid, 1, 1}, {k.block, 1, 1}, 0, stream, args);
}

}  // namespace kiln::cuda
