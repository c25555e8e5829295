// cudaMemcpy between host and device storage.
#include "backends/cuda/transfer.h"

#include <cuda_runtime_api.h>

#include "backends/cuda/device_allocator.h"
#include "gpu/cuda_check.h"

namespace kiln::cuda {

Tensor to_device(const Tensor& host) {
  KILN_CHECK(host.device().is_cpu(), "to_device: the tensor is already on {}", host.device().str());
  Tensor out(device_allocator().allocate(host.nbytes()), 0, host.shape(), host.dtype());
  KILN_CUDA_CHECK(cudaMemcpy(out.raw(), host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
  return out;
}

Tensor to_host(const Tensor& device) {
  if (device.device().is_cpu()) return device.clone();
  Tensor out = Tensor::empty(device.shape(), device.dtype());
  KILN_CUDA_CHECK(cudaMemcpy(out.raw(), device.raw(), device.nbytes(), cudaMemcpyDeviceToHost));
  return out;
}

void copy_tensor(const Tensor& src, Tensor& dst) {
  KILN_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy: {} {} into {} {}",
             src.shape().str(), dtype_name(src.dtype()), dst.shape().str(),
             dtype_name(dst.dtype()));
  KILN_CUDA_CHECK(cudaMemcpy(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault));
}

}  // namespace kiln::cuda
