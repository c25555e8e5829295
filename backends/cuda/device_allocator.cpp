// Best-fit reuse of cached blocks (a cached block at most twice the request), cudaMalloc
// on a miss, and one retry after releasing the cache when the device is out of memory.
#include "backends/cuda/device_allocator.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "core/error.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {

std::size_t round_allocation(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20;
  if (bytes == 0) return kSmall;
  if (bytes <= (std::size_t{1} << 20)) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

DeviceAllocator& device_allocator() {
  static DeviceAllocator* allocator =
      new DeviceAllocator();  // intentionally leaked: outlives every storage
  return *allocator;
}

std::shared_ptr<Storage> DeviceAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round_allocation(bytes);
  void* ptr = nullptr;
  std::size_t block = size;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first <= 2 * size) {
      block = it->first;
      ptr = it->second;
      free_.erase(it);
      stats_.cached -= block;
    }
  }
  if (ptr == nullptr) {
    cudaError_t status = cudaMalloc(&ptr, size);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error, give the cache back, try once more
      release_cached();
      status = cudaMalloc(&ptr, size);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      const AllocatorStats s = stats();
      throw Error(fmt::format(
          "CUDA out of memory: a request of {} bytes failed ({}); kiln has {} bytes in use and {} "
          "cached; "
          "the device has {} of {} bytes free",
          bytes, cudaGetErrorString(status), s.in_use, s.cached, free_bytes, total_bytes));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.device_mallocs;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.in_use += block;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  }
  int device = 0;
  KILN_CUDA_CHECK(cudaGetDevice(&device));
  return std::make_shared<Storage>(ptr, bytes, Device::cuda(device),
                                   [this, block](void* p) { give_back(p, block); });
}

void DeviceAllocator::give_back(void* ptr, std::size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  free_.emplace(size, ptr);
  stats_.in_use -= size;
  stats_.cached += size;
}

AllocatorStats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void DeviceAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_in_use = stats_.in_use;
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [size, ptr] : free_) cudaFree(ptr);
  free_.clear();
  stats_.cached = 0;
}

}  // namespace kiln::cuda
