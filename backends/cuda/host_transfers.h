// The host ends of a queued CUDA run (Program::enqueue): its outputs copied into pinned
// memory on the step's stream, read into fresh tensors once the step is done, and the
// variables the user assigned from the host uploaded through pinned memory, so that queuing
// a step never waits for the device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <vector>

#include "backends/program.h"

namespace kiln::cuda {

// Pinned buffers for a step's outputs, allocated once.
class PinnedOutputs {
 public:
  // The outputs of `graph` (name, type), read at `pointers` (device) in the same order.
  PinnedOutputs(const Graph& graph, std::vector<const void*> pointers);
  ~PinnedOutputs();
  PinnedOutputs(const PinnedOutputs&) = delete;
  PinnedOutputs& operator=(const PinnedOutputs&) = delete;

  void download(cudaStream_t stream);  // queues the copies behind the step
  Outputs read() const;                // fresh host tensors; after the copies finished

 private:
  struct Output {
    std::string name;
    TensorType type;
    const void* device = nullptr;
    void* pinned = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<Output> outputs_;
};

// One pinned buffer, grown as needed, for the host tensors a run uploads; reused by the
// next run, which starts only once this one finished (Program::enqueue).
class PinnedUploads {
 public:
  PinnedUploads() = default;
  ~PinnedUploads();
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  void start_run() { used_ = 0; }
  // Queues the copy of `host` into `device` on `stream`; the host tensor may go away at once.
  // Uploads that do not fit the buffer grow it, waiting for the stream first.
  void upload(const Tensor& host, void* device, cudaStream_t stream);

 private:
  void* buffer_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
};

}  // namespace kiln::cuda
