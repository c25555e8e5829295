// A reference-counted block of bytes on one device; tensors are views into it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace kiln {

class Storage {
 public:
  using Deleter = std::function<void(void*)>;

  Storage(void* data, std::size_t bytes, Device device, Deleter deleter);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // 64-byte aligned host memory, uninitialised.
  static std::shared_ptr<Storage> allocate_cpu(std::size_t bytes);

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

 private:
  void* data_;
  std::size_t bytes_;
  Device device_;
  Deleter deleter_;
};

}  // namespace kiln
