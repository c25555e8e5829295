// Host tensors are cloned; device tensors come back through the CUDA backend.
#include "backends/host_copy.h"

#include <fmt/format.h>

#ifdef KILN_HAVE_CUDA
#include "backends/cuda/transfer.h"
#endif

namespace kiln {

Tensor to_host(const Tensor& t) {
  if (t.device().is_cpu()) return t.clone();
#ifdef KILN_HAVE_CUDA
  return cuda::to_host(t);
#else
  throw Error(fmt::format("to_host: a tensor on {} in a build without CUDA", t.device().str()));
#endif
}

}  // namespace kiln
