// DeviceWarmUp: starts a GPU's one-time set-up on a thread of its own, so that it runs while
// the caller parses flags, loads data and builds and fuses its graph. On an H200 the
// driver's context takes ~210 ms and cuBLAS's first GEMM ~80-110 ms (it loads the
// library's kernels) in a bare process; both would otherwise come one after the other
// before the first step. A CUDA program waits for the warm-up to end before its first work on
// the device (cuda::wait_for_warm_ups: the two racing, cuBLAS failed now and then), which it
// would otherwise wait for inside the driver. Errors are the caller's to report: its first
// call meets the same error with its own message. A CPU device starts nothing. Joined on
// destruction.
#pragma once

#include <thread>

#include "core/device.h"

namespace kiln {

class DeviceWarmUp {
 public:
  explicit DeviceWarmUp(const Device& device);
  ~DeviceWarmUp();
  DeviceWarmUp(const DeviceWarmUp&) = delete;
  DeviceWarmUp& operator=(const DeviceWarmUp&) = delete;

 private:
  std::thread thread_;
};

}  // namespace kiln
