// The CUDA launchers of the ops that are not fused groups (matmul, convolution, pooling,
// layout, random, the LSTM recurrence), one entry per op name of the table, each prepared once with
// fixed device pointers so that a step can be captured into a CUDA graph.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gpu/cuda_runtime.h"
#include "gpu/kernel_source.h"
#include "graph/op.h"

namespace kiln::cuda {

struct LaunchSetup {
  const Node& node;
  std::vector<TensorType> input_types;
  std::vector<const void*> inputs;  // device pointers, fixed for the program's life
  std::vector<void*> outputs;
  void* workspace = nullptr;  // conv_workspace_bytes of the largest convolution
  std::size_t workspace_bytes = 0;
  void* status = nullptr;  // one_hot's error status (device)
};

using Launch = std::function<void(gpu::Stream)>;

// The launch of `setup.node`; kiln::Error if the op has no CUDA kernel.
Launch prepare_launch(const LaunchSetup& setup);
bool has_cuda_launcher(const std::string& op_name);
// The hand-written kernels the launch of `node` may use, so that a program compiles them
// all in parallel up front instead of one by one at their first launch (none for ops
// whose kernels come from cuBLAS or whose list is not known).
std::vector<gpu::KernelSource> kernel_sources_for(const Node& node,
                                                  const std::vector<TensorType>& input_types);
// Workspace bytes a node needs (convolutions), 0 for the others.
std::size_t workspace_bytes_for(const Node& node, const std::vector<TensorType>& input_types);

}  // namespace kiln::cuda
