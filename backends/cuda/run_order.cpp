// The last queued run's end event, behind a mutex.
#include "backends/cuda/run_order.h"

#include <mutex>

#include "gpu/cuda_check.h"

namespace kiln::cuda {
namespace {

struct LastRun {
  std::mutex mutex;
  cudaEvent_t end = nullptr;
};

LastRun& last_run() {
  static LastRun last;
  return last;
}

}  // namespace

void wait_for_last_run(cudaStream_t stream) {
  LastRun& last = last_run();
  std::lock_guard lock(last.mutex);
  if (last.end) KILN_CUDA_CHECK(cudaStreamWaitEvent(stream, last.end));
}

void publish_run_end(cudaEvent_t end) {
  LastRun& last = last_run();
  std::lock_guard lock(last.mutex);
  last.end = end;
}

void forget_run_end(cudaEvent_t end) {
  LastRun& last = last_run();
  std::lock_guard lock(last.mutex);
  if (last.end == end) last.end = nullptr;
}

}  // namespace kiln::cuda
