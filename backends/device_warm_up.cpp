#include "backends/device_warm_up.h"

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/warm_up.h"
#endif

namespace kiln {

DeviceWarmUp::DeviceWarmUp(const Device& device) {
#ifdef KILN_HAVE_CUDA
  if (!device.is_cpu()) thread_ = std::thread([index = device.index] { cuda::warm_up(index); });
#else
  (void)device;
#endif
}

DeviceWarmUp::~DeviceWarmUp() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace kiln
