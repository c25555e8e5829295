// The CUDA backend's entry of an op that is not a fused group: how a node is prepared for
// launch, the hand-written kernels it may launch, the workspace and the status memory it
// needs. Each family registers its entries beside its launchers (add_conv_ops in conv_op.cpp,
// add_pool_ops in pool.cpp, ...); cuda_op looks one up.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpu/cuda_runtime.h"
#include "gpu/kernel_source.h"
#include "graph/op.h"
#include "graph/op_id.h"
#include "cuda_op_families.h"

namespace kiln::cuda {

// What a node's launch is prepared with: pointers fixed for the program's life, so that a
// step can be captured into a CUDA graph.
struct LaunchSetup {
  const Node& node;
  std::vector<TensorType> input_types;
  std::vector<const void*> inputs;  // device pointers
  std::vector<void*> outputs;
  void* workspace = nullptr;  // shared by the nodes of a stream: the largest workspace_bytes
  std::size_t workspace_bytes = 0;
  void* status = nullptr;  // this node's own status_bytes, zeroed when the program is built
};

using Launch = std::function<void(gpu::Stream)>;
using InputTypes = std::vector<TensorType>;

struct CudaOpEntry {
  // The node's launch; reads the attributes once, the returned closure only launches.
  std::function<Launch(const LaunchSetup&)> prepare;
  // The hand-written kernels the launch may use, compiled in parallel before the first run
  // (empty: cuBLAS or copies only).
  std::function<std::vector<gpu::KernelSource>(const Node&, const InputTypes&)> sources;
  // Scratch the launch needs (convolutions), shared by the nodes of one stream.
  std::function<std::size_t(const Node&, const InputTypes&)> workspace_bytes;
  // Device memory of the node's own, zeroed once: one_hot's error report, the persistent
  // LSTM's barrier counters.
  std::function<std::size_t(const Node&, const InputTypes&)> status_bytes;
  // Run after each step that launched the node (its stream synchronised): throws
  // kiln::Error for what the status reports (one_hot's out-of-range label).
  std::function<void(const Node&, const void* status, gpu::Stream)> check_status;
  // Every kernel the op can launch, for any node (every dtype and tile): what
  // all_kernel_sources lists for the compile-everything test. Ops that share kernels (the
  // pooling passes) set it on one of them.
  std::function<std::vector<gpu::KernelSource>()> every_source;
};

using CudaOpTable = std::map<OpId, CudaOpEntry>;

// The entry of `op`, or nullptr when the CUDA backend has no kernel for it.
const CudaOpEntry* cuda_op(OpId op);
const CudaOpTable& cuda_op_table();

// The families of entries, each registered by add_<family>_ops(CudaOpTable&) in its launcher
// file (conv: conv_op.cpp, collective: all_reduce.cpp, norm: layer_norm.cpp, the others
// <family>.cpp). KILN_CUDA_OP_FAMILIES is generated from the list in backends/cuda/CMakeLists.txt,
// where a new family adds its name beside its file.
#define KILN_CUDA_OP_FAMILY_DECLARE(family) void add_##family##_ops(CudaOpTable& table);
KILN_CUDA_OP_FAMILIES(KILN_CUDA_OP_FAMILY_DECLARE)
#undef KILN_CUDA_OP_FAMILY_DECLARE

}  // namespace kiln::cuda
