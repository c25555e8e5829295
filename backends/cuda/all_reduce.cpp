// The CUDA op entry of all_reduce_mean: the collective group's device path (NCCL) on the
// step's stream; group 0 (this process alone) only copies.
#include <cuda_runtime_api.h>

#include "backends/cuda/op_entry.h"
#include "gpu/cuda_check.h"
#include "graph/collective.h"

namespace kiln::cuda {
namespace {

Launch prepare_all_reduce(const LaunchSetup& s) {
  const int id = static_cast<int>(s.node.attrs.integer("group"));
  Collective& group = collective(id);
  std::vector<Collective::DeviceBuffer> buffers;
  for (std::size_t i = 0; i < s.inputs.size(); ++i)
    buffers.push_back(
        {s.inputs[i], s.outputs[i], s.input_types[i].shape.numel(), s.input_types[i].dtype});
  if (id == 0)
    return [buffers](gpu::Stream st) {
      for (const Collective::DeviceBuffer& b : buffers)
        if (b.in != b.out && b.count > 0)
          KILN_CUDA_CHECK(cudaMemcpyAsync(b.out, b.in,
                                          static_cast<std::size_t>(b.count) * dtype_size(b.dtype),
                                          cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(st)));
    };
  return [&group, buffers](gpu::Stream st) { group.all_reduce_mean_device(buffers, st); };
}

}  // namespace

void add_collective_ops(CudaOpTable& table) {
  table[OpId::all_reduce_mean] = {.prepare = prepare_all_reduce};
}

}  // namespace kiln::cuda
