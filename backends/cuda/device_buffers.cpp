// bind_device_buffers: every value's device pointer from the memory plan and the sources.
#include "backends/cuda/device_buffers.h"

#include "backends/cuda/device_allocator.h"
#include "backends/cuda/transfer.h"
#include "core/error.h"
#include "graph/op.h"

namespace kiln::cuda {
namespace {

// The pointer of a source node's value: a staged input, a variable (moved to the device),
// or a constant copied there.
void* bind_source(const Node& n, DeviceBuffers& b, std::size_t& next_input) {
  if (n.op->id == OpId::input) return b.stager->buffer(next_input++);
  if (n.op->id == OpId::variable) {
    if (n.variable->value.device().is_cpu())
      n.variable->value = to_device(n.variable->value);  // parameters move to the GPU
    b.variables.emplace_back(n.variable, n.variable->value);
    return n.variable->value.raw();
  }
  const Tensor host =
      n.op->id == OpId::fill
          ? Tensor::full(n.outputs[0].shape, n.attrs.real("value"), n.outputs[0].dtype)
          : n.constant;
  b.constants.push_back(to_device(host));
  return b.constants.back().raw();
}

}  // namespace

DeviceBuffers bind_device_buffers(const Graph& g, const Lowering& lowering) {
  const MemoryPlan& plan = lowering.plan;
  DeviceBuffers b;
  b.arena = device_allocator().allocate(std::max<std::size_t>(plan.arena_bytes, kArenaAlign));
  auto* base = static_cast<char*>(b.arena->data());
  b.slot_offset = plan.slot_offset;
  std::vector<std::int32_t> input_nodes;
  for (std::size_t id = 0; id < g.nodes().size(); ++id)
    if (g.nodes()[id].op->id == OpId::input) input_nodes.push_back(static_cast<std::int32_t>(id));
  b.stager = std::make_unique<InputStager>(g, input_nodes);
  b.ptr.resize(g.nodes().size());
  std::size_t next_input = 0;
  for (std::size_t id = 0; id < g.nodes().size(); ++id) {
    const Node& n = g.nodes()[id];
    auto& out = b.ptr[id];
    out.assign(n.outputs.size(), nullptr);
    if (n.op->kind == OpKind::source) {
      out[0] = bind_source(n, b, next_input);
    } else if (n.op->alias) {
      out[0] = b.pointer(n.inputs[0]);
    } else {
      for (std::size_t i = 0; i < n.outputs.size(); ++i)
        out[i] = base + plan.slot_offset[static_cast<std::size_t>(plan.slot[id][i])];
    }
  }
  // Updates that are safe in place write straight into the variables (no copy at the end).
  // The group then reads the old value and writes the new one at the same element index
  // (its only access to both), so the __restrict__ on its parameters is never contradicted.
  for (std::size_t k = 0; k < lowering.in_place.size(); ++k) {
    if (!lowering.in_place[k].in_place) continue;
    const auto& [var, ref] = g.assignments()[k];
    KILN_ASSERT(!var->value.device().is_cpu(),
                "in-place update of {}, which the step does not read", var->name);
    b.ptr[static_cast<std::size_t>(ref.node)][static_cast<std::size_t>(ref.index)] =
        var->value.raw();
  }
  return b;
}

}  // namespace kiln::cuda
