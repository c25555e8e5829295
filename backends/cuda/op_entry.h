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
};

using CudaOpTable = std::map<OpId, CudaOpEntry>;

// The entry of `op`, or nullptr when the CUDA backend has no kernel for it.
const CudaOpEntry* cuda_op(OpId op);

// The families' registrations (one per launcher file), called once by cuda_op.
void add_matmul_ops(CudaOpTable& table);      // matmul.cpp
void add_conv_ops(CudaOpTable& table);        // conv_op.cpp
void add_pool_ops(CudaOpTable& table);        // pool.cpp
void add_layout_ops(CudaOpTable& table);      // layout.cpp
void add_random_ops(CudaOpTable& table);      // random.cpp
void add_lstm_ops(CudaOpTable& table);        // lstm.cpp
void add_collective_ops(CudaOpTable& table);  // all_reduce.cpp

}  // namespace kiln::cuda
