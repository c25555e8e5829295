// Host storage allocation (aligned for SIMD loads).
#include "core/storage.h"

#include <cstdlib>
#include <new>

#include "core/error.h"

namespace kiln {

Storage::Storage(void* data, std::size_t bytes, Device device, Deleter deleter)
    : data_(data), bytes_(bytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (deleter_) deleter_(data_);
}

std::shared_ptr<Storage> Storage::allocate_cpu(std::size_t bytes) {
  constexpr std::size_t alignment = 64;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* data = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  KILN_CHECK(data != nullptr, "out of host memory: could not allocate {} bytes", bytes);
  return std::make_shared<Storage>(data, bytes, Device::cpu(), [](void* p) { std::free(p); });
}

}  // namespace kiln
