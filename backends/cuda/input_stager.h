// The inputs of a CUDA program: one device buffer per graph input, filled for each run from
// the host batch through pinned memory on a copy stream; a batch announced ahead (prefetch)
// is copied while the previous step computes, so the run given it starts at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "backends/program.h"

namespace kiln::cuda {

class InputStager {
 public:
  // Buffers for the input nodes of `graph` (node ids in order); `graph` must outlive this.
  InputStager(const Graph& graph, std::vector<std::int32_t> input_nodes);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // The device buffer the step reads input k (of the ids given) from.
  void* buffer(std::size_t k) const { return buffers_[k].raw(); }
  // Fills the buffers with `feeds` before any work queued next on `step_stream`: from the
  // batch staged ahead when it is these tensors (a device copy), else through pinned memory.
  void load(const std::vector<Feed>& feeds, cudaStream_t step_stream);
  // Announces the feeds of the run after the next (types checked now); stage() copies them.
  void announce(const std::vector<Feed>& next);
  // Starts copying the announced batch on the copy stream, behind the step just queued.
  void stage();

 private:
  bool load_staged(const std::vector<Feed>& feeds, cudaStream_t step_stream);
  void copy(const std::vector<Feed>& feeds, const std::vector<Tensor>& into,
            const std::vector<void*>& pinned);

  const Graph& graph_;
  std::vector<std::int32_t> nodes_;
  std::vector<Tensor> buffers_;  // what the step reads
  std::vector<void*> pinned_;    // per input: pinned staging of the host batch
  std::vector<Tensor> staged_;   // the next batch, copied ahead
  std::vector<void*> staged_pinned_;
  std::vector<const void*> staged_sources_;  // host pointers of the batch now in staged_
  std::vector<Feed> announced_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t loaded_ = nullptr, staged_ready_ = nullptr, staged_consumed_ = nullptr;
};

}  // namespace kiln::cuda
