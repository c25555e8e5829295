// The order of queued CUDA runs (Program::enqueue): a run waits on the device for the end of
// the run queued before it, by any program of the process, so that runs execute in the order
// they were queued (a GAN's generator step after the discriminator step whose updates it
// reads) without the host waiting between them. Programs are queued from one thread.
#pragma once

#include <cuda_runtime_api.h>

namespace kiln::cuda {

// Makes `stream` wait for the end of the run queued last, if one was.
void wait_for_last_run(cudaStream_t stream);
// `end` has just been recorded at the end of a run: the next run waits for it.
void publish_run_end(cudaEvent_t end);
// A program going away (its streams synchronised): forgets `end` if it was the last.
void forget_run_end(cudaEvent_t end);

}  // namespace kiln::cuda
