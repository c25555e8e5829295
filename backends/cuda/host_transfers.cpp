// PinnedOutputs and PinnedUploads: cudaMallocHost buffers and the asynchronous copies
// through them.
#include "backends/cuda/host_transfers.h"

#include <algorithm>
#include <cstring>

#include "gpu/cuda_check.h"

namespace kiln::cuda {

PinnedOutputs::PinnedOutputs(const Graph& graph, std::vector<const void*> pointers) {
  std::size_t k = 0;
  for (const auto& [name, ref] : graph.outputs()) {
    const TensorType& t = graph.type(ref);
    Output o{name, t, pointers.at(k++), nullptr,
             static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype)};
    KILN_CUDA_CHECK(cudaMallocHost(&o.pinned, std::max<std::size_t>(o.bytes, 1)));
    outputs_.push_back(std::move(o));
  }
}

PinnedOutputs::~PinnedOutputs() {
  for (const Output& o : outputs_) cudaFreeHost(o.pinned);
}

void PinnedOutputs::download(cudaStream_t stream) {
  for (const Output& o : outputs_)
    KILN_CUDA_CHECK(cudaMemcpyAsync(o.pinned, o.device, o.bytes, cudaMemcpyDeviceToHost, stream));
}

Outputs PinnedOutputs::read() const {
  Outputs out;
  for (const Output& o : outputs_) {
    Tensor host = Tensor::empty(o.type.shape, o.type.dtype);
    std::memcpy(host.raw(), o.pinned, o.bytes);
    out[o.name] = std::move(host);
  }
  return out;
}

PinnedUploads::~PinnedUploads() {
  if (buffer_) cudaFreeHost(buffer_);
}

void PinnedUploads::upload(const Tensor& host, void* device, cudaStream_t stream) {
  constexpr std::size_t kAlign = 64;
  const std::size_t bytes = host.nbytes(), at = (used_ + kAlign - 1) / kAlign * kAlign;
  if (at + bytes > capacity_) {  // earlier uploads of this run may still read the old buffer
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (buffer_) KILN_CUDA_CHECK(cudaFreeHost(buffer_));
    capacity_ = std::max<std::size_t>(2 * capacity_, bytes + 4096);
    KILN_CUDA_CHECK(cudaMallocHost(&buffer_, capacity_));
    used_ = 0;
    upload(host, device, stream);
    return;
  }
  char* staged = static_cast<char*>(buffer_) + at;
  std::memcpy(staged, host.raw(), bytes);
  KILN_CUDA_CHECK(cudaMemcpyAsync(device, staged, bytes, cudaMemcpyHostToDevice, stream));
  used_ = at + bytes;
}

}  // namespace kiln::cuda
