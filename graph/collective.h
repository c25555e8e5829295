// Collective: the ranks of a data-parallel job as the all_reduce_mean op sees them. The op
// names its group by an id; the runtime behind the id (NCCL on the GPU, TCP on the CPU,
// dist/) registers itself here, so graph/ needs nothing from the layers above it.
// Group 0 is always this process alone (world size 1: averaging is the identity).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/tensor.h"

namespace kiln {

class Collective {
 public:
  // One tensor of an all-reduce on the device: `count` elements read at `in`, their mean
  // over the ranks written at `out` (which may equal `in`).
  struct DeviceBuffer {
    const void* in = nullptr;
    void* out = nullptr;
    std::int64_t count = 0;
    DType dtype = DType::f32;
  };

  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Host tensors (contiguous, floating) replaced by their mean over the ranks, in place.
  virtual void all_reduce_mean_host(std::span<Tensor> tensors) = 0;
  // Device buffers averaged as one group of calls queued on `stream` (a cudaStream_t), so
  // that it can sit inside a captured CUDA graph. kiln::Error where the group has no GPU path.
  virtual void all_reduce_mean_device(std::span<const DeviceBuffer> buffers, void* stream) = 0;
};

// Registers a group and returns its id (> 0) for all_reduce_mean's "group" attribute.
int register_collective(std::shared_ptr<Collective> group);
// Removes a group (programs compiled with its id must not run afterwards).
void unregister_collective(int id);
// The group of an id; kiln::Error naming the id when none is registered.
Collective& collective(int id);

}  // namespace kiln
