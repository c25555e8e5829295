// The caching device allocator: blocks freed by tensors return to size-classed free lists
// and are reused, so the steady state makes no cudaMalloc or cudaFree; statistics say
// what is in use, cached and the peak. Out of memory is a kiln::Error with the numbers.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "core/storage.h"

namespace kiln::cuda {

struct AllocatorStats {
  std::size_t in_use = 0;  // bytes handed out and not yet returned
  std::size_t cached = 0;  // bytes held in free lists
  std::size_t peak_in_use = 0;
  std::size_t device_mallocs = 0;  // cudaMalloc calls so far
};

class DeviceAllocator {
 public:
  // Device memory of at least `bytes` (256-byte aligned) on the current device; the
  // storage returns it to this allocator when its last tensor is gone.
  std::shared_ptr<Storage> allocate(std::size_t bytes);
  AllocatorStats stats() const;
  void reset_peak();
  // Returns every cached block to the driver.
  void release_cached();

 private:
  void give_back(void* ptr, std::size_t size);

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;  // size -> block
  AllocatorStats stats_;
};

// The process-wide allocator (never destroyed, so storages freed at exit stay valid).
DeviceAllocator& device_allocator();

// Size class: 512-byte granules up to 1 MiB, then multiples of 2 MiB.
std::size_t round_allocation(std::size_t bytes);

}  // namespace kiln::cuda
