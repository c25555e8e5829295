// The collective groups behind the all_reduce_mean op (graph/collective.h) for the ranks of
// a ProcessGroup: NCCL on the GPU (one communicator per rank, its id sent from rank 0 over
// the ProcessGroup), and the ProcessGroup's own TCP path on the CPU.
#pragma once

#include <memory>

#include "distributed/process_group.h"
#include "graph/collective.h"

namespace kiln::dist {

// Host tensors averaged through the ProcessGroup (star through rank 0, the same bits on
// every rank); no device path. `group` must outlive the result.
std::shared_ptr<Collective> make_host_collective(ProcessGroup& group);

// True when kiln was built with NCCL.
bool have_nccl();

// An NCCL communicator over the ranks of `group` on this process's current CUDA device,
// averaging device buffers with ncclAllReduce(ncclAvg) grouped on the step's stream (also
// inside a captured CUDA graph), and host tensors through `group`. NVLink multicast is
// kept off (NCCL_NVLS_ENABLE=0). A failure of another rank aborts the communicator, so no
// call stays blocked. kiln::Error when kiln has no NCCL or NCCL fails (its message).
std::shared_ptr<Collective> make_nccl_collective(ProcessGroup& group);

}  // namespace kiln::dist
