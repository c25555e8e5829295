// Builds without NCCL (no CUDA Toolkit, or one without nccl.h): the GPU path reports it.
#include "core/error.h"
#include "distributed/collectives.h"

namespace kiln::dist {

bool have_nccl() { return false; }

std::shared_ptr<Collective> make_nccl_collective(ProcessGroup&) {
  throw Error(
      "data-parallel training on GPUs needs NCCL, and this kiln was built without it (no CUDA "
      "Toolkit with nccl.h was found)");
}

}  // namespace kiln::dist
