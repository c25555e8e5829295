#include "backends/device_warm_up.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/warm_up.h"
#endif

namespace kiln {

DeviceWarmUp::DeviceWarmUp(const Device& device) {
#ifdef KILN_HAVE_CUDA
  if (device.is_cpu()) return;
  cuda::warm_up_started();
  try {
    thread_ = std::thread([index = device.index] { cuda::warm_up(index); });
  } catch (...) {  // no thread: nothing for a program to wait for
    cuda::warm_up_ended();
    throw;
  }
#else
  (void)device;
#endif
}

DeviceWarmUp::~DeviceWarmUp() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace kiln
