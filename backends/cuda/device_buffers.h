// The device memory of a compiled step, bound once: one arena laid out by the memory plan,
// the inputs' staging buffers, constants copied to the device, the adopted variables, and
// the device pointer of every value (updates done in place point at their variable).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "backends/cuda/input_stager.h"
#include "backends/lowering.h"
#include "core/tensor.h"

namespace kiln::cuda {

struct DeviceBuffers {
  std::shared_ptr<Storage> arena;
  std::vector<std::size_t> slot_offset;  // the memory plan's, for scratch()
  std::vector<std::vector<void*>> ptr;   // [node][output]
  std::unique_ptr<InputStager> stager;
  std::vector<Tensor> constants;                          // fills and tensor constants
  std::vector<std::pair<VariablePtr, Tensor>> variables;  // adopted device tensors
  void* pointer(ValueRef ref) const {
    return ptr[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)];
  }
  // A scratch slot of the memory plan (MemoryPlan::scratch).
  void* scratch(std::int32_t slot) const {
    return static_cast<char*>(arena->data()) + slot_offset[static_cast<std::size_t>(slot)];
  }
};

// Moves the variables g reads to the device (parameters live there from now on).
DeviceBuffers bind_device_buffers(const Graph& g, const Lowering& lowering);

}  // namespace kiln::cuda
