// InputStager: pinned host staging, the copy stream, and the events that order a staged
// batch between the copy stream and the step's stream.
#include "backends/cuda/input_stager.h"

#include <cstring>

#include "backends/cuda/device_allocator.h"
#include "backends/feeds.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {

InputStager::InputStager(const Graph& graph, std::vector<std::int32_t> input_nodes)
    : graph_(graph), nodes_(std::move(input_nodes)) {
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&loaded_, &staged_ready_, &staged_consumed_})
    KILN_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  for (std::int32_t node : nodes_) {
    const TensorType& t = graph_.node(node).outputs[0];
    const std::size_t bytes = static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype);
    buffers_.emplace_back(device_allocator().allocate(bytes), 0, t.shape, t.dtype);
    staged_.emplace_back(device_allocator().allocate(bytes), 0, t.shape, t.dtype);
    for (std::vector<void*>* pinned : {&pinned_, &staged_pinned_}) {
      pinned->push_back(nullptr);
      KILN_CUDA_CHECK(cudaMallocHost(&pinned->back(), std::max<std::size_t>(bytes, 1)));
    }
  }
}

InputStager::~InputStager() {
  if (copy_stream_) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
  }
  for (void* p : pinned_) cudaFreeHost(p);
  for (void* p : staged_pinned_) cudaFreeHost(p);
  for (cudaEvent_t e : {loaded_, staged_ready_, staged_consumed_})
    if (e) cudaEventDestroy(e);
}

// Host tensors go through `pinned` (an asynchronous copy from pageable memory would not
// overlap); device tensors are copied device to device. Both on the copy stream.
void InputStager::copy(const std::vector<Feed>& feeds, const std::vector<Tensor>& into,
                       const std::vector<void*>& pinned) {
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    const Tensor& t = feed_for(graph_.node(nodes_[k]), feeds);
    if (t.device().is_cpu()) {
      std::memcpy(pinned[k], t.raw(), t.nbytes());
      KILN_CUDA_CHECK(cudaMemcpyAsync(into[k].raw(), pinned[k], t.nbytes(), cudaMemcpyHostToDevice,
                                      copy_stream_));
    } else {
      KILN_CUDA_CHECK(cudaMemcpyAsync(into[k].raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToDevice,
                                      copy_stream_));
    }
  }
}

void InputStager::load(const std::vector<Feed>& feeds, cudaStream_t step_stream) {
  if (load_staged(feeds, step_stream)) return;
  copy(feeds, buffers_, pinned_);
  KILN_CUDA_CHECK(cudaEventRecord(loaded_, copy_stream_));
  KILN_CUDA_CHECK(cudaStreamWaitEvent(step_stream, loaded_));
}

// The batch a previous run copied ahead, if these feeds are it: copied device to device.
bool InputStager::load_staged(const std::vector<Feed>& feeds, cudaStream_t step_stream) {
  if (staged_sources_.empty()) return false;
  for (std::size_t k = 0; k < nodes_.size(); ++k)
    if (feed_for(graph_.node(nodes_[k]), feeds).raw() != staged_sources_[k]) return false;
  KILN_CUDA_CHECK(cudaStreamWaitEvent(step_stream, staged_ready_));
  for (std::size_t k = 0; k < nodes_.size(); ++k)
    KILN_CUDA_CHECK(cudaMemcpyAsync(buffers_[k].raw(), staged_[k].raw(), staged_[k].nbytes(),
                                    cudaMemcpyDeviceToDevice, step_stream));
  KILN_CUDA_CHECK(cudaEventRecord(staged_consumed_, step_stream));
  staged_sources_.clear();
  return true;
}

void InputStager::announce(const std::vector<Feed>& next) {
  check_feed_names(graph_, next);
  for (std::int32_t node : nodes_) feed_for(graph_.node(node), next);  // types checked now
  announced_ = next;
}

void InputStager::stage() {
  if (announced_.empty()) return;
  KILN_CUDA_CHECK(cudaEventSynchronize(
      staged_ready_));  // the previous staging copy has left the pinned buffers
  KILN_CUDA_CHECK(
      cudaStreamWaitEvent(copy_stream_, staged_consumed_));  // and the step has taken its batch
  copy(announced_, staged_, staged_pinned_);
  staged_sources_.clear();
  for (std::int32_t node : nodes_)
    staged_sources_.push_back(feed_for(graph_.node(node), announced_).raw());
  KILN_CUDA_CHECK(cudaEventRecord(staged_ready_, copy_stream_));
  announced_.clear();
}

}  // namespace kiln::cuda
